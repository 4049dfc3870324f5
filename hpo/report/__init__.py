"""The comparison report: one self-contained HTML page per experiment (and one comparing several), built only
from what the database holds.

    data.py        everything read from storage, as plain numbers (trials, outcomes, curves, the verdict, the rungs
                   and promotions of a multi-fidelity tuner)
    bands.py       best-so-far curves and their bootstrap band over trial order
    importance.py  hyperparameter importance: permutation importance on a random-forest surrogate
    scaling.py     several experiments: samples to target and the noise scale against global batch size, and per
                   optimizer the fit of hpo.evidence.batch_scaling (B_crit, E_min, the largest batch within 1.5x E_min)
    figures.py     matplotlib figures (Agg, object API: safe in the server's threads) as base64 PNG
    markup.py      the page frame and CSS, tagged table cells, figures as data: URIs, number formatting
    batch_view.py  the batch-size view (an experiment's arms at several batch sizes; the comparison page)
    html.py        the pages: one experiment, several compared, the list of experiments
    text.py        the batch-size view as terminal lines (`hpo report`, `hpo import rcp`)

`hpo.report.html` has the entry points: `experiment_report(storage, name)`, `comparison_report(storage, names)`
and `index_page(storage)` return the HTML text. Importing this package imports nothing heavy.
"""
