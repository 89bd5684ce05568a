"""The counter-based generator (dpaudit.dpsgd.philox) against Random123's known answers and an
independent Philox-4x32-10 (randomgen), its CPU normals against an exact transform and
torch's own kernels, and its distributions by distribution tests."""

from __future__ import annotations

import math
import os
import sys

import numpy as np
import pytest
import torch
from scipy import stats

from dpaudit import dpsgd
from dpaudit.dpsgd import philox

# Random123's kat_vectors for philox4x32 10: counter (4 words), key (2 words) -> output.
KAT = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
       ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
       ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]


@pytest.mark.parametrize("counter,key,want", KAT)
def test_philox4x32_10_known_answers(counter, key, want):
    words = philox.philox4x32(*(torch.tensor([c]) for c in counter),
                              *(torch.tensor([k]) for k in key))
    assert [int(w) for w in words] == list(want)


@pytest.mark.parametrize("bulk", [False, True])
@pytest.mark.parametrize("seed", [0, 7, 2 ** 32 + 5, 0x1234567890ABCDEF, 2 ** 64 - 1])
def test_words_equal_randomgens_philox(seed, bulk, monkeypatch):
    """Value i of (seed, stream, step) is word i % 4 of block (i // 4, step, stream, 0)
    under key (low, high 32 bits of the seed): randomgen's Philox(number=4, width=32),
    which increments its counter before each block, from counter (block - 1). Both CPU
    paths: the torch operations' and the bulk draw's (the compiled kernels)."""
    randomgen = pytest.importorskip("randomgen")
    monkeypatch.setattr(philox, "CPU_BULK_BLOCKS", 0 if bulk else 2 ** 40)
    for stream, step in ((philox.NOISE, 0), (philox.BATCH, 12345), (philox.CANARY, 2 ** 32 - 1),
                         (philox.INIT, 0)):  # the last: block -1 borrows through all 128 bits
        got = philox.draw("words", philox.keys([seed], "cpu"), stream, step, 4 * 50 + 3)[0]
        start = (step << 32) + (stream << 64)
        bg = randomgen.Philox(key=seed, counter=(start - 1) % 2 ** 128, number=4, width=32)
        want = bg.random_raw(4 * 51)[:4 * 50 + 3].astype(np.int64)
        np.testing.assert_array_equal(got.numpy(), want)


def test_the_bulk_cpu_draw_gives_random123s_known_answer(monkeypatch):
    """Counter (0, 0, 0, 0) under key (0, 0) is block 0 of step 0, stream 0 of seed 0."""
    monkeypatch.setattr(philox, "CPU_BULK_BLOCKS", 0)
    got = philox.draw("words", philox.keys([0], "cpu"), philox.INIT, 0, 4)[0]
    assert got.tolist() == list(KAT[0][2])


def test_the_cpu_draws_are_the_same_bits_from_the_compiled_kernels_and_from_torch(monkeypatch):
    """Every kind, from the bulk path (the compiled kernels) and from the torch operations:
    the same bits, normals included (the same float64 operations in the same order); several
    runs and steps, odd sizes, edge steps and keys, one thread and three, and the size
    rule's threshold."""
    seeds = [0, 1, 2 ** 32 - 1, 2 ** 32, 2 ** 64 - 1, 0x9E3779B97F4A7C15]
    key = philox.keys(seeds, "cpu")
    cases = [(philox.NOISE, 0, 1), (philox.NOISE, 2 ** 32 - 1, 4 * 257 - 3),
             (philox.INIT, 0, 4 * 300 + 2), (philox.CANARY, torch.tensor([0, 1, 2 ** 32 - 1]), 777),
             (philox.PERMUTATION, 5, 2 * 4 * 256 + 1), (philox.BATCH, torch.tensor([9]), 10 ** 4 + 1)]
    threads = torch.get_num_threads()
    for stream, steps, count in cases:
        for kind in philox.KINDS:
            got = {}
            for bulk, n_threads in ((False, 1), (True, 1), (True, 3)):
                monkeypatch.setattr(philox, "CPU_BULK_BLOCKS", 0 if bulk else 2 ** 40)
                torch.set_num_threads(n_threads)
                try:
                    got[bulk, n_threads] = philox.draw(kind, key, stream, steps, count, 0.3)
                finally:
                    torch.set_num_threads(threads)
            want = got[False, 1]
            for other in ((True, 1), (True, 3)):
                assert got[other].dtype == want.dtype and got[other].shape == want.shape
                assert torch.equal(got[other], want), (kind, stream, steps, count, other)
    # the size rule: below CPU_BULK_BLOCKS blocks the torch operations, from it on the
    # kernels, the same bits on both sides of it (and many normals: 1.6 M)
    monkeypatch.undo()
    bulk, real = [], philox._cpu_bulk
    monkeypatch.setattr(philox, "_cpu_bulk", lambda *a: bulk.append(a[4]) or real(*a))
    n = 4 * philox.CPU_BULK_BLOCKS
    small, large = (philox.draw("normal", philox.keys(range(64), "cpu"), philox.NOISE, 3, c)
                    for c in (n - 4, 25186))
    monkeypatch.setattr(philox, "CPU_BULK_BLOCKS", 2 ** 40)
    assert torch.equal(small, philox.draw("normal", philox.keys(range(64), "cpu"),
                                          philox.NOISE, 3, n - 4))
    assert torch.equal(large, philox.draw("normal", philox.keys(range(64), "cpu"),
                                          philox.NOISE, 3, 25186))
    assert bulk == [-(-25186 // 4)]  # the small draw was the torch operations'


def test_without_numba_the_cpu_draws_the_same_bits_with_a_warning(monkeypatch):
    """A machine without numba (or where it fails to import) draws with the torch
    operations, says so once, and gets the same words and normals."""
    key = philox.keys([5, 2 ** 40], "cpu")
    want = [philox.draw(kind, key, philox.NOISE, 2, 4 * 300) for kind in ("words", "normal")]
    monkeypatch.setattr(philox, "_KERNELS", False)
    monkeypatch.setitem(sys.modules, "dpaudit.dpsgd.cpu_draws", None)  # import fails
    monkeypatch.delattr(dpsgd, "cpu_draws", raising=False)
    with pytest.warns(UserWarning, match="compiled draws are not used"):
        got = [philox.draw(kind, key, philox.NOISE, 2, 4 * 300) for kind in ("words", "normal")]
    assert philox._KERNELS is None
    assert all(torch.equal(g, w) for g, w in zip(got, want))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork: POSIX only")
def test_the_draws_threads_are_kept_and_shut_down_before_a_fork(monkeypatch):
    """The bulk draw's threads are kept between draws (one pool, of torch's thread count);
    before a fork they are shut down, since a child has none of its parent's threads and
    would wait on them forever: the child starts with no pool, the parent makes a new one
    at its next threaded draw, and both draw the same bits. (The child only reads the
    pool's state: other tests' OpenMP threads make anything more a hazard of its own.)"""
    monkeypatch.setattr(philox, "_THREADED_BLOCKS", 0)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        key = philox.keys(range(8), "cpu")
        want = philox.draw("normal", key, philox.NOISE, 4, 4 * 300)
        pool = philox._pool(2)
        assert philox._pool(2) is pool and list(philox._POOL) == [2]
        pid = os.fork()
        if pid == 0:  # the child
            os._exit(0 if not philox._POOL else 1)
        assert os.waitpid(pid, 0)[1] == 0
        assert not philox._POOL
        with pytest.raises(RuntimeError, match="shutdown"):
            pool.submit(lambda: 0)
        assert torch.equal(philox.draw("normal", key, philox.NOISE, 4, 4 * 300), want)
        assert philox._pool(2) is not pool
    finally:
        torch.set_num_threads(threads)


def _exact_normals(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """sqrt(-2 ln((a + 1) 2^-32)) (cos, sin)(2 pi b 2^-32) in long double (64-bit
    mantissa on x86-64), the angle reduced in integers as the transform does, so that the
    values near the cosine's and sine's zeros keep their relative precision: (n, 2)."""
    L = np.longdouble
    r = np.sqrt(-2 * np.log((a.astype(L) + 1) / L(2 ** 32)))
    q = (b + 2 ** 29) >> 30
    x = (b - (q << 30)).astype(L) * (L("6.283185307179586476925286766559005768") / L(2 ** 32))
    c, s = np.cos(x), np.sin(x)
    cos = np.select([q % 4 == 0, q % 4 == 1, q % 4 == 2], [c, -s, -c], s)
    sin = np.select([q % 4 == 0, q % 4 == 1, q % 4 == 2], [s, c, -s], -c)
    return np.stack([r * cos, r * sin], 1)


def test_the_cpus_normals_are_the_exact_transform_rounded_to_float32():
    """box_muller_fdlibm against the transform in long double: the float32 rounding of the
    exact value, but where that value lies within 2^-40 (relative) of a float32 rounding
    boundary; on 2 M random word pairs and on the edges (u = 2^-32 and 1, the radius's
    sqrt(2) boundaries, the quarter and eighth turns and their neighbours)."""
    rng = np.random.default_rng(0)
    edges_a = [0, 1, 2, 2 ** 31 - 1, 2 ** 31, 2 ** 32 - 2, 2 ** 32 - 1]
    edges_a += [int(2 ** k * math.sqrt(2)) + d for k in range(1, 32) for d in (-1, 0, 1)]
    edges_b = [j * 2 ** 29 + d for j in range(8) for d in (-2, -1, 0, 1, 2)]
    edges_b = [v % 2 ** 32 for v in edges_b] + [2 ** 32 - 1]
    a = np.concatenate([rng.integers(0, 2 ** 32, 2 ** 21), np.repeat(edges_a, len(edges_b))])
    b = np.concatenate([rng.integers(0, 2 ** 32, 2 ** 21), np.tile(edges_b, len(edges_a))])
    a = np.minimum(a, 2 ** 32 - 1)
    got = philox.box_muller_fdlibm(torch.from_numpy(a).view(-1, 1, 1),
                                   torch.from_numpy(b).view(-1, 1, 1)).view(-1, 2).numpy()
    exact = _exact_normals(a, b)
    want = exact.astype(np.float32)
    # a float32 rounding boundary: the midpoint between want and its neighbour on exact's side
    side = np.where(exact >= want.astype(np.longdouble), np.inf, -np.inf).astype(np.float32)
    mid = (want.astype(np.longdouble) + np.nextafter(want, side).astype(np.longdouble)) / 2
    clear = np.abs(exact - mid) > np.abs(exact) * np.longdouble(2.0 ** -40)
    assert clear.mean() > 0.9999
    wrong = (got != want) & clear
    assert not wrong.any(), (a[wrong.any(1)][:5], b[wrong.any(1)][:5])


def test_the_cpus_normals_are_the_gpus_transform_to_float_rounding():
    """The CPU's transform (fdlibm's polynomials) against the device's own kernels (the
    GPU's transform, here torch's CPU float64 log, cosine and sine) on 4 M normals: at most
    a few differ (a few in 10^8 do: a float32 rounding straddle, or a value near a zero of
    the cosine or sine, where the GPU's angle, rounded before its reduction, is the less
    exact), each by float rounding."""
    key = philox.keys(range(40), "cpu")
    words = philox.draw("words", key, philox.NOISE, torch.arange(4), 4 * 6250)
    pairs = words.view(40, 4, -1, 2, 2)
    cpu = philox.box_muller_fdlibm(pairs[..., 0], pairs[..., 1])
    assert torch.equal(cpu, philox.draw("normal", key, philox.NOISE, torch.arange(4), 4 * 6250))
    gpu = philox._box_muller(pairs[..., 0], pairs[..., 1])
    differ = cpu != gpu
    assert int(differ.sum()) <= 4
    torch.testing.assert_close(cpu, gpu, rtol=1e-6, atol=1e-12)


def test_a_runs_draws_do_not_depend_on_the_others_or_on_how_steps_are_grouped():
    key = philox.keys([3, 99, 2 ** 40], "cpu")
    for kind in ("words", "normal", "uniform", "sort_keys"):
        many = philox.draw(kind, key, philox.NOISE, torch.arange(5, 9), 37)
        assert many.shape == (3, 4, 37)
        for k in range(3):
            alone = philox.draw(kind, key[k:k + 1], philox.NOISE, 7, 37)
            assert torch.equal(alone[0], many[k, 2])
    # a longer draw starts with the shorter one; other streams and steps are other words
    a = philox.draw("words", key, philox.NOISE, 5, 10)
    assert torch.equal(philox.draw("words", key, philox.NOISE, 5, 30)[:, :10], a)
    assert not torch.equal(philox.draw("words", key, philox.BATCH, 5, 10), a)
    assert not torch.equal(philox.draw("words", key, philox.NOISE, 6, 10), a)


def test_normals_are_standard_normal_and_independent():
    key = philox.keys(range(20), "cpu")
    z = philox.draw("normal", key, philox.NOISE, torch.arange(3), 5000).double()
    flat = z.reshape(-1).numpy()  # 300,000 values
    assert abs(flat.mean()) < 5 / math.sqrt(flat.size)
    assert abs((flat ** 2).mean() - 1) < 5 * math.sqrt(2 / flat.size)
    assert stats.kstest(flat, "norm").pvalue > 1e-3
    for c in (2.0, 3.0):  # the tails: Binomial counts beyond c
        p = 2 * stats.norm.sf(c)
        assert abs((np.abs(flat) > c).mean() - p) < 5 * math.sqrt(p * (1 - p) / flat.size)
    # the cosine and sine of one pair, consecutive steps, and runs: uncorrelated
    for a, b in ((z[..., 0::2], z[..., 1::2]), (z[:, 0], z[:, 1]), (z[:-1], z[1:])):
        r = np.corrcoef(a.reshape(-1).numpy(), b.reshape(-1).numpy())[0, 1]
        assert abs(r) < 5 / math.sqrt(a.numel())
    assert float(z.abs().max()) <= math.sqrt(64 * math.log(2))


def test_bernoulli_rate_is_exact_in_words_and_within_sampling_error():
    key = philox.keys(range(50), "cpu")
    words = philox.draw("words", key, philox.BATCH, 4, 2000)
    for rate in (0.0, 0.2, 0.5, 1.0, 1 / 3):
        hit = philox.draw("bernoulli", key, philox.BATCH, 4, 2000, rate)
        assert torch.equal(hit, words < math.floor(rate * 2 ** 32))
        if 0 < rate < 1:
            p = float(hit.double().mean())
            assert abs(p - rate) < 5 * math.sqrt(rate * (1 - rate) / hit.numel())
    assert philox.draw("bernoulli", key, philox.BATCH, 4, 10, 1.0).all()
    assert not philox.draw("bernoulli", key, philox.BATCH, 4, 10, 0.0).any()
    with pytest.raises(ValueError, match=r"bernoulli rate=1.5: must be in \[0, 1\]"):
        philox.draw("bernoulli", key, philox.BATCH, 4, 10, 1.5)


def test_uniforms_and_sort_keys():
    key = philox.keys(range(10), "cpu")
    u = philox.draw("uniform", key, philox.INIT, 0, 3000)
    assert u.dtype == torch.float64 and 0 < float(u.min()) and float(u.max()) < 1
    assert stats.kstest(u.reshape(-1).numpy(), "uniform").pvalue > 1e-3
    words = philox.draw("words", key, philox.INIT, 0, 6000)
    s = philox.draw("sort_keys", key, philox.INIT, 0, 3000)
    assert torch.equal(s, (words[:, 0::2] << 31) | (words[:, 1::2] >> 1))
    assert int(s.min()) >= 0 and int(s.max()) < 2 ** 63


def test_keys_and_arguments_are_checked():
    assert philox.keys([2 ** 64 - 1, 5], "cpu").tolist() == [[2 ** 32 - 1, 2 ** 32 - 1], [5, 0]]
    for bad in (-1, 2 ** 64, 1.5, True):
        with pytest.raises(ValueError, match="must be an integer in"):
            philox.keys([bad], "cpu")
    with pytest.raises(ValueError, match="kind='gamma': must be one of"):
        philox.draw("gamma", philox.keys([1], "cpu"), 0, 0, 3)


@pytest.mark.slow  # started first: compiling takes a minute on 2 busy cores
@pytest.mark.compiles
def test_the_gpus_fused_draws_run_on_the_cpu_and_train_the_same_models():
    """The GPU's path (each draw one compiled kernel) taken on the CPU: the same words as
    the eager draws, the normals to float rounding; and under a forced GPU description
    the trainer takes it and trains the CPU's models (to float rounding). One test, so that
    one process compiles (tens of seconds on 2 cores)."""
    from dpaudit import device

    key = philox.keys([1, 2 ** 33 + 7, 12345], "cpu")
    for kind in ("words", "bernoulli", "sort_keys", "normal"):
        eager = philox.draw(kind, key, philox.CANARY, 4, 301, 0.4)
        fused = philox.draw(kind, key, philox.CANARY, 4, 301, 0.4, fused=True)
        if kind == "normal":
            torch.testing.assert_close(fused, eager, rtol=1e-6, atol=1e-6)
        else:
            assert torch.equal(fused, eager), kind
    for fn in (philox._words, philox._normals):  # compiled, not fallen back
        assert philox._FUSED[fn] is not fn
    assert not torch._dynamo.config.disable
    g = torch.Generator().manual_seed(1)
    X, y = torch.randn(50, 6, generator=g), torch.randint(0, 2, (50,), generator=g)
    model = dpsgd.ModelSpec("fnn", 6, hidden=4)
    cfg = dpsgd.DPSGDConfig(2, 10, 0.3, 1.0, 0.9, "poisson")
    plain = dpsgd.train(X, y, model, cfg, [4, 5], device="cpu")
    gpu = device.GpuDescription("NVIDIA H100 80GB HBM3", 80 * 2 ** 30, 79 * 2 ** 30, "9.0", 132)
    calls = []
    real = philox.draw
    with device.forced_gpu(gpu):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(philox, "draw",
                       lambda *a, **kw: calls.append((a[0], kw.get("fused"))) or real(*a, **kw))
            fused = dpsgd.train(X, y, model, cfg, [4, 5], device="cuda")
    assert {kind for kind, on in calls if on} == {"normal", "bernoulli"}  # noise, batches
    assert {kind for kind, on in calls if not on} == {"uniform"}  # the init, once
    torch.testing.assert_close(dpsgd.flatten(fused), dpsgd.flatten(plain), rtol=1e-5, atol=1e-6)
