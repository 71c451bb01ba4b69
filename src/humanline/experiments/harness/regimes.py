"""The demo's regimes by name: a data regime, optionally with a humanline variant and its options.

    NAME     := DATA [ "+" VARIANT OPTION* ]
    DATA     := offline | online | sparse | sparse<N>   (sparse<N>: sample every N steps, e.g. sparse64;
                                                        plain sparse: the command's own period)
              | stale<N>     every step trains on samples drawn N versions earlier (train.regime: stale)
              | rounds<N>    the paper's online DPO/KTO (iterative): a round of N steps is sampled from the
                             round's starting policy, which is also its reference (train.regime: sparse,
                             sample_every: N, reference: sampler); plain `online` keeps the initial policy
    VARIANT  := humanline    syncing and clipping (the objective's k and band, see `humanline.experiments.demo.run`)
              | nll<W>       the NLL anchor alone (objective.nll_weight: W), no humanline, e.g. online+nll0.1
              | sync-only    syncing, no transform (humanline.transform: none; no band, so never the auto one)
              | clip-only    the clip against the initial policy, never synced (one sync at step 0)
              | reject       syncing and stochastic rejection (humanline.transform: reject)
              | CORRECTION   a stale-sample correction alone (objective.correction), no humanline
    CORRECTION := drop | tis | decoupled | m2po   (GRPO on sampled data: docs/method.md §3.6)
    OPTION   := -k<N>        sync every N steps
              | -CORRECTION  the correction beside humanline, e.g. stale16+humanline-tis
              | -kauto[D]    the sync period follows the drift (humanline.sync_every: auto); D: its target mean
                             |token log-ratio| (humanline.sync_drift), e.g. -kauto0.02
              | -auto[L,H]   the self-calibrating band (humanline.band: auto) with every setting at its default
                             (it starts from +-1.5, not from the objective's tuned band); L,H: its quantiles
                             (humanline.band_quantiles), e.g. -auto0.1,0.95
              | -band<L>,<H> a fixed band [L, H], e.g. -band-0.1,0.2
              | -nll<W>      the NLL anchor beside humanline (objective.nll_weight: W), e.g. sparse8+humanline-nll0.1

Examples: `offline+humanline`, `offline+humanline-k16`, `offline+humanline-kauto`, `offline+humanline-auto`,
`offline+humanline-band-0.3,0.3`, `stale16`, `stale16+tis`, `stale16+humanline`, `stale16+humanline-tis`.
The ablation (`humanline demo --ablation`, the paper's Figure 5) runs `ABLATION` for each objective.
"""

from __future__ import annotations

import re

from humanline.errors import UserError
from humanline.objectives import corrections

NO_SYNC = 10**9  # "clip-only": a sync period longer than any run, so the only sync is step 0's (the initial policy)

VARIANTS = {
    "humanline": {"enabled": True},
    "sync-only": {"enabled": True, "transform": "none", "band": "fixed"},  # no clip, so no band to calibrate
    "clip-only": {"enabled": True, "sync_every": NO_SYNC},
    "reject": {"enabled": True, "transform": "reject"},
}
CORRECTIONS = tuple(c for c in corrections.CORRECTIONS if c != "none")  # objective.correction besides none
_OPTION = re.compile(r"-k(?P<k>\d+)|-kauto(?P<drift>[0-9.]+(?:e-?[0-9]+)?)?"
                     r"|-auto(?:(?P<q_lo>[0-9.]+),(?P<q_hi>[0-9.]+))?|-band(?P<low>-?[0-9.]+),(?P<high>-?[0-9.]+)"
                     r"|-nll(?P<nll>[0-9.]+(?:e-?[0-9]+)?)"
                     r"|-(?P<correction>" + "|".join(CORRECTIONS) + r")\b")
_NLL = re.compile(r"nll(?P<nll>[0-9.]+(?:e-?[0-9]+)?)")

# The named regimes of the default demo and of --regimes' help.
REGIMES = ("offline", "offline+humanline", "online", "online+humanline", "sparse", "sparse+humanline")
# The paper's Figure 5, per objective: each part alone, both, the stochastic form, the sync period, the auto band.
ABLATION = ("offline", "offline+sync-only", "offline+clip-only", "offline+humanline", "offline+reject",
            "offline+humanline-k1", "offline+humanline-k4", "offline+humanline-k16", "offline+humanline-auto",
            "online")


def regime_overrides(name: str) -> dict:
    """Config overrides (nested dict) for the regime `name` (grammar in the module doc); UserError if malformed."""
    data, _, rest = name.partition("+")
    overrides: dict = {"train": _data_regime(name, data)}
    if not rest:
        return overrides
    if data.startswith("rounds"):
        raise UserError(f"--regimes: {name!r}: a rounds<N> regime takes no variant (its reference is each round's "
                        f"starting policy); humanline on sampled data is sparse<N>+humanline")
    if rest in CORRECTIONS:
        _needs_samples(name, overrides)
        return {**overrides, "objective": {"correction": rest}}
    nll = _NLL.fullmatch(rest)
    if nll:
        return {**overrides, "objective": {"nll_weight": _weight(name, nll.group("nll"))}}
    variant = next((v for v in sorted(VARIANTS, key=len, reverse=True) if rest.startswith(v)), None)
    if variant is None:
        raise UserError(f"--regimes: {name!r}: expected {data}+ followed by one of "
                        f"{', '.join((*VARIANTS, 'nll<W>', *CORRECTIONS))}")
    humanline = dict(VARIANTS[variant])
    options = rest[len(variant):]
    for match in _OPTION.finditer(options):
        found = match.groupdict()
        if found["correction"]:
            _needs_samples(name, overrides)
            overrides.setdefault("objective", {})["correction"] = found["correction"]
        elif found["nll"]:
            overrides.setdefault("objective", {})["nll_weight"] = _weight(name, found["nll"])
        elif found["k"]:
            humanline["sync_every"] = int(found["k"])
        elif match.group(0).startswith("-kauto"):
            humanline["sync_every"] = "auto"
            if found["drift"]:
                humanline["sync_drift"] = float(found["drift"])
        elif match.group(0).startswith("-auto"):
            humanline.update(band="auto", low=-1.5, high=1.5)  # no objective-specific tuning at all
            if found["q_lo"]:
                humanline["band_quantiles"] = [float(found["q_lo"]), float(found["q_hi"])]
        else:
            humanline.update(band="fixed", low=float(found["low"]), high=float(found["high"]))  # even where the
            # objective's own band is auto (KTO's in reproduce): the name says a fixed band
    if _OPTION.sub("", options):
        raise UserError(f"--regimes: {name!r}: cannot read the options {options!r} (expected -k<N>, -kauto[D], "
                        f"-auto[L,H], -band<low>,<high>, -nll<W>, -{', -'.join(CORRECTIONS)})")
    overrides["humanline"] = humanline
    return overrides


def _weight(name: str, text: str) -> float:
    """The W of a `nll<W>` part, a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise UserError(f"--regimes: {name!r}: nll<W> needs a weight W > 0, got {text!r}")
    return value


def _data_regime(name: str, data: str) -> dict:
    """The `train` overrides of a regime name's data part."""
    if data in ("offline", "online", "sparse"):
        return {"regime": data}
    numbered = re.fullmatch(r"(sparse|stale|rounds)([0-9]+)", data)
    if numbered is None or (numbered.group(1) != "stale" and int(numbered.group(2)) == 0):
        raise UserError(f"--regimes: {name!r} does not start with offline, online, sparse, sparse<N> (N >= 1), "
                        f"rounds<N> (N >= 1) or stale<N>")
    kind, n = numbered.group(1), int(numbered.group(2))
    if kind == "rounds":
        return {"regime": "sparse", "sample_every": n, "reference": "sampler"}
    return {"regime": "sparse", "sample_every": n} if kind == "sparse" else {"regime": "stale", "staleness": n}


def _needs_samples(name: str, overrides: dict) -> None:
    """A correction reweighs samples against the policy that drew them: no sampler, nothing to correct."""
    if overrides["train"]["regime"] == "offline":
        raise UserError(f"--regimes: {name!r}: a correction needs sampled data (online, sparse or stale<N>); "
                        f"offline data has no sampler policy")


def ablation_regimes(default_k: int) -> list[str]:
    """`ABLATION` for an objective whose `offline+humanline` syncs every `default_k` steps (that k's own row
    would repeat it, so it is left out)."""
    return [r for r in ABLATION if r != f"offline+humanline-k{default_k}"]
