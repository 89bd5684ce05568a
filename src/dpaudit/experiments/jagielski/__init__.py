"""The DP-SGD audits of Jagielski, Ullman, Oprea (2020): tasks, trials and their bounds.

The paper's Algorithms 1-4, Figure 2 and Table 2 (as summarised in the CY 7790 Lecture 17
notes, Northeastern 2021) and the authors' code
(``jagielski/auditing-dpsgd``). One *cell* is a training setup (data set, model, clipping
norm C, initialisation, noise multiplier) and one *attack*; it trains T models on each of
the attack's neighbouring data sets (its *sides*) and scores every model:

=========  ===================================  ===========================================
attack     D0 (label 0 = "out")                 D1 (label 1 = "in"), one side per k
=========  ===================================  ===========================================
mi         the task without its last row        the task (its last row is the target)
backdoor   the task                             last k rows -> patched class-0 images,
                                                labelled 1 (Algorithm 3, ``make_old.py``)
clipbkd    last row -> (x_p, 1 - y_p)           last k rows -> (x_p, y_p) (Algorithm 4,
           (``d0="flipped"``, the reference's   ``make_new.py``)
           experiments) or the task (``clean``)
=========  ===================================  ===========================================

Statistics (higher = "in", :mod:`dpaudit.canaries`): ``mi`` = minus the loss on the
target; ``backdoor`` = minus the summed loss of the patched class-0 test images with
label 1; ``clipbkd`` = ``(f(x_p) - f(0))_{y_p}`` (Algorithm 4) and ``clipbkd_logit`` =
``f(x_p)_{y_p}`` (the reference's ``make_nps.py``). The bound (:func:`audit_scores`) is
[JUO20] Algorithm 2 with the reference's threshold split: the first half of each side's
trials choose the threshold, the second half give the Clopper-Pearson eps_LB at
``1 - alpha`` for a group of k rows (``dpaudit.bounds``).

The training-set order is random (FMNIST: the reference's subset draw; CIFAR: a seeded
permutation), so "the last rows" are random rows, as in the reference. Model seeds
depend on the attack, side and trial, never on C, the init or the noise, so every cell
of a grid sees the same batches and noise draws (paired comparisons across the grid).

Modules: :mod:`.tasks` (the data tasks), :mod:`.grid` (cells, config keys, paths),
:mod:`.training` (sides, seeds, scores, kept blocks), :mod:`.audit` (a cell's bounds) and
:mod:`.paper` (Table 2 against the paper); this package re-exports their public names,
all but the grid's imported on first use (:mod:`dpaudit.lazy`: :mod:`.tasks` and
:mod:`.training` import torch, :mod:`.audit` and :mod:`.paper` scipy.stats): the workflow's
start-up and the command lines' parsers read only the grid.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy import lazy_attributes
from .grid import (ATTACKS, AUDIT_KEYS, DATASETS, MADE_WITH_KEYS, PAPER_TOL, STATISTICS,
                   TASK_KEYS, TRAIN_KEYS, TRAINED_DIR, cell_file, cell_path, check_grid,
                   grid_cells, grid_models, group_dir, group_dirs, groups, init_label,
                   score_columns, side_names, table_spec, train_spec)

if TYPE_CHECKING:
    from .audit import (BOOTSTRAPS, COLUMNS, PAPER_STATISTIC, RESPLITS, ROC_LEVELS,
                        SPLIT_PERCENTILES, audit_scores, read_result_table, read_scores,
                        summarize_cell, theoretical_eps)
    from .paper import (PAPER_CLIPS, PAPER_COLUMN, PAPER_TABLE2, TABLE2_COLUMNS, TABLE2_NOTES,
                        eps_label, init_name, init_order, paper_agreement, paper_table2,
                        table2_markdown, with_paper_table2)
    from .tasks import POOL_SIZE, TASK_ARRAYS, Task, cifar_task, fmnist_task, make_task
    from .training import (YEOM_POINTS, Calls, Store, model_seeds, run_group, score_models,
                           sides, trainer_digest)

__getattr__, __dir__, _LAZY = lazy_attributes(globals())

__all__ = ["ATTACKS", "DATASETS", "STATISTICS", "TRAIN_KEYS", "TASK_KEYS", "AUDIT_KEYS",
           "MADE_WITH_KEYS", "TASK_ARRAYS", "POOL_SIZE", "YEOM_POINTS", "Task", "make_task",
           "fmnist_task", "cifar_task", "sides", "model_seeds", "score_models", "run_group",
           "Calls", "Store",
           "trainer_digest", "audit_scores", "summarize_cell", "COLUMNS", "ROC_LEVELS",
           "init_label", "init_name", "cell_path", "cell_file", "group_dir", "group_dirs",
           "TRAINED_DIR", "check_grid", "table_spec", "grid_cells", "groups", "grid_models",
           "train_spec", "TABLE2_NOTES", "theoretical_eps", "PAPER_TABLE2", "PAPER_CLIPS",
           "paper_table2", "with_paper_table2", "PAPER_TOL", "TABLE2_COLUMNS", "PAPER_COLUMN",
           "PAPER_STATISTIC", "RESPLITS", "BOOTSTRAPS", "SPLIT_PERCENTILES", "eps_label", "init_order",
           "paper_agreement", "table2_markdown", "side_names", "score_columns", "read_scores",
           "read_result_table"]
