"""The Snakemake workflow: lint, config validation, DAGs, end to end (cluster jobs:
test_slurm.py).

Snakemake is run as ``python -m snakemake`` in a subprocess (its Python API changes
between releases), with ``--directory`` pointing at a temporary folder.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from dpaudit.io import read_table

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ["hw3_eps_vs_eps", "hw3_eps_vs_m", "hw3_eps_vs_d", "abadi_fig2", "composition",
           "ridge_audit", "jagielski_fig2", "jagielski_table2", "trials_needed",
           "tramer_canary_losses", "abadi_fig3", "abadi_fig6"]


def snakemake(*args, cwd=ROOT, timeout=900):
    """Snakemake on the workflow, with the GPUs hidden (``CUDA_VISIBLE_DEVICES=""``): the
    same jobs and results on a machine with GPUs as without (training rules run as CPU
    jobs); ``tests/test_cuda.py`` checks the CUDA paths."""
    return subprocess.run([sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"),
                           *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})


def merged(base: dict, overlay: dict) -> dict:
    """``base`` with ``overlay`` merged in as Snakemake merges ``--configfile`` files over
    the default config: mappings key by key, recursively; any other value (lists included)
    replaced whole. Neither argument is changed."""
    out = dict(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return copy.deepcopy(out)


def load(name: str) -> dict:
    """A config as the workflow sees it: ``config.yaml``, or an overlay such as
    ``quick.yaml`` merged over it."""
    cfg = yaml.safe_load((ROOT / "config" / name).read_text())
    return cfg if name == "config.yaml" else merged(load("config.yaml"), cfg)


def write_config(tmp_path: Path, cfg: dict) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_lint_is_clean():
    out = snakemake("--lint")
    assert out.returncode == 0, out.stderr
    assert "Lints for" not in out.stdout + out.stderr


def test_every_figure_has_a_target_in_the_full_dag(tmp_path):
    out = snakemake("-n", "--cores", "1", "--directory", str(tmp_path))
    assert out.returncode == 0, out.stderr
    for name in FIGURES:
        assert f"figures/{name}.pdf" in out.stdout, name


@pytest.mark.parametrize("cfg", ["config.yaml", "quick.yaml"])
def test_configs_validate_against_schema(cfg):
    import jsonschema

    schema = yaml.safe_load((ROOT / "src" / "dpaudit" / "schema.yaml").read_text())
    jsonschema.validate(load(cfg), schema)


@pytest.mark.parametrize("path,value,words", [
    (("ridge", "lam"), -1.0, ["lam", "0"]),
    (("ridge", "bogus"), 1, ["bogus"]),
    (("seed",), "zero", ["seed", "integer"]),
])
def test_bad_config_stops_naming_the_key(tmp_path, path, value, words):
    cfg = load("quick.yaml")
    section = cfg
    for key in path[:-1]:
        section = section[key]
    section[path[-1]] = value
    out = snakemake("-n", "--cores", "1", "--directory", str(tmp_path),
                    "--configfile", str(write_config(tmp_path, cfg)))
    assert out.returncode != 0
    for word in words:
        assert word in out.stdout + out.stderr


def test_unknown_target_names_the_targets_that_exist(tmp_path):
    """A target no rule makes: one message naming the named targets and the figures (the
    named targets' too, no table),
    instead of Snakemake's bare MissingRuleException; a real target beside it is not
    named."""
    out = snakemake("-n", "--cores", "1", "--directory", str(tmp_path), "--",
                    "figures/hw3_eps_vs_n.pdf", "tramr", "zzqq", "figures/hw3_eps_vs_m.pdf",
                    "tramer")
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "MissingRuleException" not in text
    assert ("figures/hw3_eps_vs_n.pdf: no rule makes it (did you mean figures/hw3_eps_vs_m.pdf "
            "or figures/hw3_eps_vs_d.pdf?). tramr: no rule makes it (did you mean tramer?). "
            "zzqq: no rule makes it. A target is a name (abadi, all,") in text
    assert "figures/hw3_eps_vs_m.pdf, figures/jagielski_fig2.pdf" in text
    figures = text[text.index("a figure ("):text.index(") or any other file")]
    # the named targets' figures too, and only figures
    assert "figures/tight_audit.pdf, figures/tramer_canary_losses.pdf" in figures
    assert "figures/reference/tight_audit.pdf" in figures and ".html" not in figures


def test_a_mistyped_target_is_answered_with_the_closest_ones_alone(tmp_path):
    """Where every unknown target has a close match (difflib), the message is the guesses,
    not the list of every target."""
    out = snakemake("-n", "--cores", "1", "--directory", str(tmp_path), "--", "onrun",
                    "figures/tramer_canary_loss.pdf")
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert ("figures/tramer_canary_loss.pdf: no rule makes it (did you mean "
            "figures/tramer_canary_losses.pdf or figures/reference/tramer_canary_losses.pdf?). "
            "onrun: no rule makes it (did you mean "
            "onerun?). The targets: README, Run.") in text and "A target is a name" not in text


def test_a_dry_run_names_a_missing_data_folder(tmp_path):
    """Offline with a data.root that does not exist: the dry run (exit 0: targets without
    data still run) says so, naming the folder; an existing one is not named."""
    missing = tmp_path / "no-such-data"
    for root, said in ((missing, True), (tmp_path, False)):
        out = snakemake("-n", "--cores", "1", "--directory", str(tmp_path), "--config",
                        f"data={{root: {root}, download: false}}", "--", "hw3_eps")
        assert out.returncode == 0, out.stderr[-2000:]
        warning = f"dpaudit: warning: data.root = {root}: no such folder"
        assert (warning in out.stderr) is said, out.stderr[-2000:]


def test_nested_config_values_given_as_text_are_read_as_the_schema_wants(tmp_path):
    """Snakemake reads every value inside a nested `--config` entry as text; numbers and
    booleans are read as such where the schema wants them, strings it accepts stay."""
    from snakemake.cli import parse_config

    from dpaudit.config import typed_from_text, validate_section

    given = parse_config(["jagielski={trials: 6, ks: [1, 2], fig2: {eps: [4, inf]}}",
                          "onerun={compare_many_model: false, beta: 1e-2}"])
    assert given["jagielski"]["trials"] == "6"  # Snakemake's reading
    cfg = typed_from_text(merged(load("quick.yaml"), given))
    validate_section(cfg)
    assert cfg["jagielski"]["trials"] == 6 and cfg["jagielski"]["ks"] == [1, 2]
    assert cfg["jagielski"]["fig2"]["eps"] == ["4", "inf"]  # eps labels are strings
    assert cfg["onerun"]["compare_many_model"] is False and cfg["onerun"]["beta"] == 0.01
    # the workflow reads them so too: a value out of range is named as the number it is
    out = snakemake("-n", "--cores", "1", "--directory", str(tmp_path), "--config",
                    "jagielski={trials: 3}")
    assert out.returncode != 0
    assert "config.jagielski.trials=3: 3 is less than the minimum of 4" in out.stdout + out.stderr


def test_missing_data_stops_with_the_fix_in_the_terminal(tmp_path):
    """Offline without a local copy: the data job fails, and the terminal (not only its
    log) says which config keys to set and where the docs explain it."""
    out = snakemake("results/data/cifar.csv", "--cores", "1", "--directory", str(tmp_path),
                    "--config", f"data={{root: {tmp_path / 'empty'}, download: false}}")
    assert out.returncode != 0
    text = out.stdout + out.stderr
    for words in ("CIFAR-10 not found", "data.cifar10_tarball", "docs/data.md, section Offline"):
        assert words in text, words


def test_reference_tables_are_read_from_the_repository_whatever_the_directory(tmp_path):
    """The default `reference_dir` is relative to the repository, not to --directory (a
    dry run names the input, or reports it missing while no GPU run has filled it)."""
    out = snakemake("-n", "jagielski_reference", "--directory", str(tmp_path))
    folder = re.escape(str(ROOT / "reference"))
    assert re.search(rf"{folder}/jagielski_(fig2|table2)\.csv", out.stdout + out.stderr)


def test_single_figure_target_end_to_end(tmp_path):
    """One figure and what it needs, and nothing else; the table records config and seed."""
    cfg = load("quick.yaml")
    cfg["seed"] = 7
    cfg["ridge"].update(n=40, d=40, m=40, lam=320.0, rho=[0.5, 5.0], repeats=1)
    # targets before --configfile, which takes several values
    out = snakemake("figures/ridge_audit.pdf", "--cores", "2", "--directory", str(tmp_path),
                    "--configfile", str(write_config(tmp_path, cfg)))
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "figures/ridge_audit.pdf").stat().st_size > 0
    assert (tmp_path / "figures/ridge_audit.png").stat().st_size > 0
    df, meta = read_table(tmp_path / "results/ridge_audit.csv")
    assert meta["seed"] == 7 and meta["spec"]["rho"] == [0.5, 5.0]
    assert sorted(df.rho.unique()) == [0.5, 5.0]
    assert not (tmp_path / "figures/hw3_eps_vs_m.pdf").exists()
    rerun = snakemake("figures/ridge_audit.pdf", "-n", "--cores", "1", "--directory",
                      str(tmp_path), "--configfile", str(write_config(tmp_path, cfg)))
    assert "Nothing to be done" in rerun.stdout + rerun.stderr


def _fake_image_data(root: Path):
    """Tiny Fashion-MNIST (IDX files, torchvision's raw layout) and CIFAR-10 (ImageFolder
    PNG tree with all ten classes) in the real formats."""
    from fakedata import tiny_image_data

    tiny_image_data(root)


def _tiny_config(data: Path) -> dict:
    """Every figure of the DAG at the smallest sizes that still run (seconds per job), from
    the tiny real-format data at ``data`` (:func:`_fake_image_data`)."""
    cfg = load("quick.yaml")
    cfg["seed"] = 3
    cfg["data"].update(root=str(data), download=False)
    cfg["hw3"].update(repeats=1, grids={"eps": {"eps": [2, 8], "m": [100], "d": [100]},
                                        "m": {"eps": [8], "m": [50, 100], "d": [100]},
                                        "d": {"eps": [8], "m": [100], "d": [10, 100]}})
    cfg["accounting"]["abadi"].update(num_epochs=4, max_epochs=40)
    cfg["accounting"]["composition"].update(num_k=5, max_k=50)
    cfg["ridge"].update(n=40, d=40, m=40, lam=320.0, rho=[0.5, 5.0], repeats=1)
    jag = cfg["jagielski"]
    jag.update(trials=8, ks=[1, 2])
    jag["datasets"]["fmnist"].update(epochs=1, batch_size=10)
    jag["datasets"]["cifar"].update(epochs=1, batch_size=8, pretrain_epochs=1,
                                    pretrain_images=0)
    jag["fig2"].update(archs=["lr"], eps=["4"], init=1.0)  # both data sets, three attacks
    jag["table2"].update(clips=[1.0], inits=["fixed", 1.0], eps=["4"])
    cfg["trials_needed"].update(eps=["4"], n_min=4, n_points=2, subsamples=2)
    cfg["onerun"].update(eps=["4"], archs=["lr"], repeats=1, m=20, max_k=10,
                         canaries=["dirac"], init=1.0)  # Figure 2's cells: no extra training
    cfg["tramer"].update(runs=40, val_runs=10, batch_runs=40, n_train=40)
    cfg["tramer"]["model"].update(epochs=2, batch_size=20)
    # one level (one training job) per figure: a figure draws any number of them
    cfg["abadi"]["fig3"].update(n_train=100, n_test=0, pca_dims=8, hidden=8, lot_size=20,
                                max_epochs=1, levels=cfg["abadi"]["fig3"]["levels"][-1:])
    cfg["abadi"]["fig6"].update(public_images=60, private_images=80, test_images=40,
                                hidden=[8], max_epochs=1,
                                levels=[{"name": "eps2", "lot_size": 20, "eps": 2.0}])
    return cfg


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """One run of the whole DAG at :func:`_tiny_config`, shared by the tests of
    :class:`TestTinyRun` (with pytest-xdist a class runs in one worker, tests/conftest.py,
    so the run is made once); they only read it (a test that reruns jobs works on a
    copy)."""
    run = tmp_path_factory.mktemp("tiny_run")
    _fake_image_data(run / "data")
    cfg = _tiny_config(run / "data")
    conf = write_config(run, cfg)
    # One thread per job: the jobs are tiny, and two of them then run at once (training
    # jobs ask for 2 threads, which would run them one at a time).
    out = snakemake("--cores", "2", "--max-threads", "1", "--directory", str(run),
                    "--configfile", str(conf), timeout=1800)
    assert out.returncode == 0, out.stderr[-3000:]
    return SimpleNamespace(dir=run, cfg=cfg, conf=conf)


@pytest.fixture(scope="session")
def tiny_report(tiny_run, tmp_path_factory):
    """`--report report.zip` after :func:`tiny_run`, made once for the tests that read it:
    the finished process and the folder the zip is extracted into."""
    folder = tmp_path_factory.mktemp("tiny_report")
    # The default profile names the stylesheet relative to the folder Snakemake starts in,
    # which --directory leaves: name it whole.
    out = snakemake("--report", str(folder / "report.zip"), "--directory", str(tiny_run.dir),
                    "--configfile", str(tiny_run.conf), "--report-stylesheet", str(STYLESHEET))
    assert out.returncode == 0, out.stderr[-3000:]
    with zipfile.ZipFile(folder / "report.zip") as zf:
        zf.extractall(folder)
    return SimpleNamespace(out=out, dir=folder)


STYLESHEET = Path(__file__).resolve().parents[1] / "workflow" / "report" / "report.css"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
#: The report's views, visited in the page as a reader's clicks set them (Snakemake's
#: `app.setView`, what its menu items and figure buttons call): the front page, each
#: category's menu, each figure beside its category's menu. For each, at scroll 0 of the
#: main view: the boxes of the view, the menu, the figure or the front page's title, the
#: menu's scroll width, and the menu's labels and icons that stick out of it or the window.
_VIEWS = """<script>
window.addEventListener("load", () => setTimeout(async () => {
  const sleep = ms => new Promise(done => setTimeout(done, ms));
  const box = el => { const b = el.getBoundingClientRect();
                      return {top: b.top, left: b.left, right: b.right, bottom: b.bottom}; };
  const visit = async (name, set) => {
    set(); await sleep(300);
    const view = document.querySelector("div.h-screen.overflow-auto");  // not the nav
    view.scrollTop = 0; view.scrollLeft = 0; await sleep(50);
    const nav = document.querySelector("nav"), right = Math.min(box(nav).right, innerWidth);
    const img = view.querySelector("img"), title = view.querySelector(".prose h1");
    const cut = [...nav.querySelectorAll("span, svg")].filter(x => {
      const b = x.getBoundingClientRect();
      return b.width > 0 && (b.left < -0.5 || b.right > right + 0.5); });
    return {name, view: box(view), nav: box(nav), nav_scroll: nav.scrollWidth - nav.clientWidth,
            img: img && box(img), title: title && box(title),
            cut: cut.map(x => x.textContent.trim() || x.tagName)};
  };
  const seen = [await visit("front page", () => {})];
  for (const [category, subs] of Object.entries(categories)) {
    seen.push(await visit(`menu of ${category}`, () => app.showCategory(category)));
    for (const [subcategory, paths] of Object.entries(subs)) for (const path of paths)
      if (results[path].mime_type.startsWith("image/"))
        seen.push(await visit(path, () => app.setView({navbarMode: "subcategory", category,
          subcategory, content: "img", contentPath: results[path].data_uri, resultPath: path})));
  }
  parent.postMessage(JSON.stringify({window: [innerWidth, innerHeight], seen}), "*");
}, 1000));
</script>"""


def report_views(page: Path, width: int, height: int, profile: Path) -> dict:
    """:data:`_VIEWS` measured by headless Chromium on the report ``page`` in a ``width`` x
    ``height`` viewport: the page in an iframe of that size (a headless window's viewport
    is not the size asked for: narrower than 500 px it is widened), which posts what it
    measured to the frame page, whose body ``--dump-dom`` prints."""
    import html
    import json

    probe = page.with_name("probe.html")
    head, end, tail = page.read_text().rpartition("</body>")  # the page's own, the last
    probe.write_text(head + _VIEWS + end + tail)
    frame = page.with_name("frame.html")
    frame.write_text(f'<!DOCTYPE html><html><body style="margin:0"><iframe src="probe.html" '
                     f'width="{width}" height="{height}" style="border:0"></iframe><script>'
                     'addEventListener("message", e => document.body.setAttribute('
                     '"data-views", e.data));</script></body></html>')
    out = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                          "--disable-quic", "--no-first-run", "--disable-background-networking",
                          "--disable-component-update", "--disable-sync",
                          f"--user-data-dir={profile}", "--window-size=2000,1400",
                          "--virtual-time-budget=60000", "--dump-dom", frame.as_uri()],
                         capture_output=True, text=True, timeout=180)
    found = re.search(r'data-views="([^"]*)"', out.stdout)
    assert found, out.stderr[-2000:]
    return json.loads(html.unescape(found.group(1)))


@pytest.mark.slow
class TestTinyRun:
    """The report, the Jagielski grids and the redoing of damaged files, read from one tiny
    run of the whole DAG."""

    @pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (.ci/run installs it)")
    def test_report_views_open_on_their_top_and_the_menu_stays_usable(self, tiny_report,
                                                                       tmp_path):
        """Every view of the report at the window sizes of a laptop, a desktop and a phone
        (Snakemake's page centred content taller or wider than the window out of scroll
        reach, and on a phone the view squeezed the menu, or the menu the view): at scroll
        0, the front page's title and every figure's top edge inside the view, each figure
        no wider than the view, the view beside or below the menu (never over it), no label
        or icon of the menu cut off and no menu wider than itself; on a phone, the menu at
        most half the screen."""
        (page,) = tiny_report.dir.glob("*/report.html")
        for width, height in ((1366, 900), (1920, 1080), (390, 844)):
            got = report_views(page, width, height, tmp_path / f"chromium-{width}")
            assert got["window"] == [width, height]
            views = {v["name"]: v for v in got["seen"]}
            figures = [v for v in got["seen"] if v["img"]]
            assert len(figures) >= len(FIGURES) and "front page" in views
            for v in got["seen"]:
                view, nav, where = v["view"], v["nav"], (width, height, v["name"])
                assert view["left"] >= nav["right"] - 0.5 or view["top"] >= nav["bottom"] - 0.5, where
                assert not v["cut"] and v["nav_scroll"] <= 1, (where, v["cut"], v["nav_scroll"])
                if width < 640:
                    assert nav["bottom"] <= height / 2 + 1, where
                shown = v["img"] or v["title"]
                if shown:
                    # its top edge inside the view and the window, at scroll 0
                    assert 0 <= shown["top"] - view["top"] and shown["top"] < min(
                        view["bottom"], height), (where, shown, view)
                    assert shown["left"] >= view["left"] - 0.5, (where, shown, view)
                if v["img"]:
                    assert v["img"]["right"] <= view["right"] + 0.5, (where, v["img"], view)
            assert views["front page"]["title"], "the front page's title not found"

    def test_report_holds_every_figure_with_its_caption(self, tiny_run, tiny_report,
                                                        tmp_path):
        """`--report report.zip` after the run: every figure of `all` (and Table 2 as an
        HTML table) is in it, with its caption rendered from the config, and no markup
        warning. The captions quote the config, so a config other than the run's is
        refused."""
        run, out = tiny_run.dir, tiny_report.out
        # docutils' system messages (a duplicate link target, ...): terminal and page
        messages = re.findall(r".*\((?:INFO|WARNING|ERROR|SEVERE)/\d\).*",
                              out.stdout + out.stderr)
        assert not messages, messages
        with zipfile.ZipFile(tiny_report.dir / "report.zip") as zf:
            names = zf.namelist()
            index = next(zf.read(n).decode() for n in names if n.endswith("report.html"))
        assert "system-message" not in index and "Duplicate explicit target" not in index
        figures = sorted(p.name for p in (run / "figures").glob("*.png"))
        assert len(figures) == 13
        for name in figures + ["jagielski_table2.html"]:
            assert any(n.endswith("/" + name) for n in names), name
        assert "<table" in (run / "results/jagielski_table2.html").read_text()
        # captions are rendered with the config: the tiny run's 8 trials, its Tramer claim
        assert "8 trials per side" in index and "0.21" in index
        assert "How to read a bound" in index

        other = copy.deepcopy(tiny_run.cfg)  # a grid key and an Abadi level changed too
        other["jagielski"]["fig2"]["init"] = 2.0
        other["abadi"]["fig6"]["levels"][0]["lot_size"] = 30
        out = snakemake("--report", str(tmp_path / "other.zip"), "--directory", str(run),
                        "--configfile", str(write_config(tmp_path, other)), "--config",
                        "jagielski={trials: 40}")
        assert out.returncode != 0 and not (tmp_path / "other.zip").exists()
        differ = re.findall(r"^  (\S.* in this config)$", out.stdout + out.stderr, re.M)
        assert sorted(differ) == [
            "abadi.fig6.levels.eps2.lot_size: 20 in results/abadi/fig6_eps2.csv, 30 in this "
            "config",
            "jagielski.fig2.init: 1.0 in results/jagielski_fig2.csv, 2.0 in this config",
            "jagielski.trials: 8 in results/jagielski_fig2.csv, 40 in this config"]
        text = " ".join((out.stdout + out.stderr).split())
        # every --configfile of the run, the one given here named
        assert f"every --configfile of the run, in its order (this command's: {tmp_path}" in text
        assert "--configfile config/quick.yaml offline.yaml" in text

    def test_jagielski_figures_end_to_end_and_grids_resume(self, tiny_run, tmp_path):
        """Figure 2 and Table 2 from tiny real-format data; growing the grid trains only the
        new cells, and a grid interrupted before its table reruns only its unfinished jobs."""
        import shutil

        run, cfg = tiny_run.dir, copy.deepcopy(tiny_run.cfg)
        for name in ("jagielski_fig2", "jagielski_table2", "trials_needed"):
            for ext in ("pdf", "png"):
                assert (run / f"figures/{name}.{ext}").stat().st_size > 0
        fig2, meta = read_table(run / "results/jagielski_fig2.csv")
        assert meta["seed"] == 3 and meta["spec"]["alpha"] == 0.01
        assert len(fig2) == 2 * 3  # data sets x attacks
        assert set(fig2.attack) == {"mi", "backdoor", "clipbkd"}
        assert fig2.eps_th.gt(0).all() and (fig2.trials == 8).all()
        assert (fig2.eps_lb_best_k >= fig2.eps_lb).all() and (fig2.eps_lb >= 0).all()
        for column in ("eps_lb_katz", "eps_lb_bayes", "tpr_at_fpr_0_1pct", "tpr_at_fpr_1pct",
                       "auc"):
            assert (fig2[column] >= 0).all(), column
        needed, _ = read_table(run / "results/trials_needed.csv")
        assert sorted(needed.n.unique()) == [4, 8] and len(needed) == 2 * 2
        cifar = fig2[fig2.dataset == "cifar"]
        assert cifar.pretrained_on.str.startswith("cifar10-other-classes").all()
        md = (run / "results/jagielski_table2.md").read_text()
        assert "(1.55)" in md and "(0.75)" in md  # the noise and the paper's value, fixed init
        scores, prov = read_table(
            run / "results/jagielski/scores/fmnist_fnn_clipbkd/c1_fixed_e4.csv")
        assert prov["seed"] == 3 and prov["cell"]["noise"] == 1.55
        assert prov["trainer"]["device"] == "cpu"  # the GPUs hidden (snakemake())
        assert len(scores) == 8 * 3 and scores.seed.nunique() == 24

        # The reference target draws kept tables in another folder, training nothing.
        ref, fresh = tmp_path / "ref", tmp_path / "fresh"
        ref.mkdir()
        for name in ("jagielski_fig2.csv", "jagielski_table2.csv"):
            (ref / name).write_bytes((run / "results" / name).read_bytes())
        out = snakemake("jagielski_reference", "--cores", "1", "--directory", str(fresh),
                        "--configfile",
                        str(write_config(tmp_path, {**cfg, "reference_dir": str(ref)})))
        assert out.returncode == 0, out.stderr
        for name in ("jagielski_fig2", "jagielski_table2"):
            assert (fresh / f"figures/reference/{name}.png").stat().st_size > 0
        assert (fresh / "results/reference/jagielski_table2.md").read_text() == md
        assert not (fresh / "results/jagielski").exists()

        # On a copy of the run (timestamps kept): growing the grid, a new clip reruns only the
        # job of its group ...
        shutil.copytree(run, tmp_path / "run")
        run = tmp_path / "run"
        scores_dir = run / "results/jagielski/scores"
        jag = cfg["jagielski"]
        jag["table2"]["clips"] = [1.0, 2.0]
        targets = ["figures/jagielski_fig2.pdf", "figures/jagielski_table2.pdf",
                   "figures/trials_needed.pdf"]
        dry = snakemake(*targets, "-n", "--cores", "1", "--directory", str(run),
                        "--configfile", str(write_config(tmp_path, cfg)))
        assert dry.returncode == 0, dry.stderr
        assert _score_outputs(dry.stdout) == ["fmnist_fnn_clipbkd"]

        # ... a new eps label reruns its group's job, which reuses its kept blocks for the
        # finished cell (the same bytes) and trains only the new one; then nothing is out of
        # date.
        jag["table2"]["clips"] = [1.0]
        jag["fig2"]["eps"] = ["4", "8"]
        e4 = (scores_dir / "cifar_lr_mi/c1_g1_e4.csv").read_bytes()
        target = "results/jagielski/scores/cifar_lr_mi"
        conf = str(write_config(tmp_path, cfg))
        out = snakemake(target, "--cores", "2", "--directory", str(run), "--configfile", conf)
        assert out.returncode == 0, out.stderr
        log = (run / "logs/jagielski_train/cifar_lr_mi.log").read_text()
        assert "2 cells x 2 blocks of trials: 16 models restored, 16 to train" in log, log
        assert (scores_dir / "cifar_lr_mi/c1_g1_e4.csv").read_bytes() == e4
        assert read_table(scores_dir / "cifar_lr_mi/c1_g1_e8.csv")[1]["cell"]["noise"] == 1.02
        again = snakemake(target, "-n", "--cores", "1", "--directory", str(run),
                          "--configfile", conf)
        assert "Nothing to be done" in again.stdout + again.stderr

        # A job interrupted halfway (its outputs gone, one block kept): it trains the rest.
        (run / "results/jagielski/trained/cifar_lr_mi/in_000000-000008.csv").unlink()
        for made in ("results/jagielski_fig2.csv", "figures/jagielski_fig2.pdf",
                     "figures/jagielski_fig2.png"):
            (run / made).unlink(missing_ok=True)
        shutil.rmtree(scores_dir / "cifar_lr_mi")
        dry = snakemake(target, "-n", "--cores", "1", "--directory", str(run),
                        "--configfile", conf)
        assert _score_outputs(dry.stdout) == ["cifar_lr_mi"]
        out = snakemake(target, "--cores", "2", "--directory", str(run), "--configfile", conf)
        assert out.returncode == 0, out.stderr
        log = (run / "logs/jagielski_train/cifar_lr_mi.log").read_text()
        assert "16 models restored, 16 to train" in log, log
        assert (scores_dir / "cifar_lr_mi/c1_g1_e4.csv").read_bytes() == e4

    def test_the_command_a_damaged_file_names_makes_it_again(self, tiny_run, tmp_path, capsys,
                                                             monkeypatch):
        """On a copy of the run, a score table with one value changed: jagielski-audit names
        `snakemake --forcerun <its group's folder>`, which (with the run's other options)
        trains the group again from its intact kept blocks, giving the table back byte for
        byte; a damaged task file names its own path, which reruns its job and those that
        read it."""
        from test_integrity_readback import TRAIN_SPEC, _audit, _flip_middle, _run

        run = tmp_path / "run"
        shutil.copytree(tiny_run.dir, run)  # timestamps kept: nothing out of date
        options = ["--cores", "2", "--directory", str(run), "--configfile", str(tiny_run.conf)]
        group = "results/jagielski/scores/fmnist_lr_mi"
        monkeypatch.chdir(run)  # the workflow's paths are relative to its folder
        table = Path(group) / "c1_g1_e4.csv"
        good = table.read_bytes()
        table.write_bytes(good.replace(b",0.", b",0.1", 1))
        code, err = _run(_audit(table, "fig2.csv"), capsys)
        assert code == 2 and "its rows do not match the content hash" in err[-1], err
        command = re.search(r"redo it: (snakemake --forcerun \S+) \(with the run's other "
                            r"options\)$", err[-1]).group(1)
        assert command == f"snakemake --forcerun {group}"
        redone = snakemake(*command.split()[1:], *options, "--", group)
        assert redone.returncode == 0, redone.stderr[-3000:]
        assert table.read_bytes() == good
        log = Path("logs/jagielski_train/fmnist_lr_mi.log").read_text()
        assert "16 models restored, 0 to train" in log, log
        assert _run(_audit(table, "fig2.csv"), capsys)[0] == 0

        task = Path("results/jagielski/task_fmnist.npz")
        _flip_middle(task)
        code, err = _run(["jagielski-train", "--task", task, "--dataset", "fmnist", "--arch",
                          "lr", "--attack", "mi", "--cells", json.dumps([[1.0, "g1", "4"]]),
                          "--spec", json.dumps(TRAIN_SPEC), "--seed", "0", "--device", "cpu",
                          "--out-dir", "elsewhere"], capsys)
        assert code == 2 and err[-1].endswith(
            f"; redo it: snakemake --forcerun {task} (with the run's other options)"), err
        dry = snakemake("-n", "--forcerun", str(task), *options, "--", group)
        assert dry.returncode == 0, dry.stderr[-3000:]
        assert re.search(r"rule jagielski_task:\n(    .*\n)*    reason: Forced execution",
                         dry.stdout), dry.stdout
        assert "rule jagielski_train:" in dry.stdout


def _score_outputs(dry_run: str) -> list[str]:
    """The score-table groups a dry run's jobs write (every output of every job), sorted."""
    files = [f for line in re.findall(r"output: (.*)", dry_run) for f in line.split(", ")]
    return sorted(f.removeprefix("results/jagielski/scores/") for f in files
                  if f.startswith("results/jagielski/scores/"))
