"""`humanline demo`: the paper's comparison in miniature, on a CPU, in minutes.

A tiny character-level policy learns 2-digit addition (`tasks`); a base and a weaker policy are taught the
format once and cached (`base`); offline data are sampled from one of them (`offline`); every objective of the
objective table with its demo settings (`run.OBJECTIVES`) is aligned under each regime (`regimes`), runs side
by side in one-thread processes (`workers`); `results` writes the table, `results.json`, `report.md` and plots.
"""
