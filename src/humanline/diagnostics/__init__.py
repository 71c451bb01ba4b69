"""Diagnostics of offline data (`humanline inspect`): likelihood under the reference and perceptual distance.

    from humanline.diagnostics import score_sequences, compare, perceived_weights, histogram_kl

`scoring` turns token sequences into log-probs under a model, `data_quality` summarises average token
log-probs of a dataset, `perception` estimates KL(omega || Q) between the perceived outcome distribution and a
sampling distribution (docs/method.md §2), `plots` draws the figures, and `end_to_end` runs `inspect data` /
`inspect perception` end to end. The command line is `humanline.commands.inspection`.
"""

from humanline.diagnostics.data_quality import (
    Item,
    bottom_share,
    completion_items,
    filter_records,
    quartile_of,
    quartile_summary,
    record_scores,
)
from humanline.diagnostics.perception import (
    Comparison,
    compare,
    fit_gamma,
    histogram_kl,
    implied_capacity,
    perceived_weights,
    proposition_bound,
    quantile_edges,
    sample_kl_same_support,
)
from humanline.diagnostics.scoring import SequenceScores, load_scoring_model, score_sequences

__all__ = [
    "Comparison",
    "Item",
    "SequenceScores",
    "bottom_share",
    "compare",
    "completion_items",
    "filter_records",
    "fit_gamma",
    "histogram_kl",
    "implied_capacity",
    "load_scoring_model",
    "perceived_weights",
    "proposition_bound",
    "quantile_edges",
    "quartile_of",
    "quartile_summary",
    "record_scores",
    "sample_kl_same_support",
    "score_sequences",
]
