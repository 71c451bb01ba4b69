"""Offline data from several sources (base, hot, prompted, reference, mixtures), scored by the task's verifier,
converted by the data layer, with the quality proxy recorded next to it."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from humanline.data import load_records
from humanline.data.convert import ConvertOptions, convert_records
from humanline.errors import UserError
from humanline.experiments.harness import offline_sources as S
from humanline.experiments.reproduce import data as D
from humanline.experiments.reproduce.settings import ReproduceSettings
from humanline.experiments.reproduce.task import sum_records
from humanline.files import write_jsonl
from humanline.model.tiny import make_model, make_tokenizer
from humanline.sampling.reward_spec import build_reward
from humanline.sampling.rollout import GenerationConfig, generate


def test_the_grammar_names_one_source_or_a_weighted_mixture():
    assert S.parse_offline_source("base") == [("base", 1.0)]
    assert S.parse_offline_source("mix:base=1,reference=3") == [("base", 0.25), ("reference", 0.75)]
    for bad in ("warm", "mix:base=0.5,warm=0.5", "mix:base=0", "mix:base=1,base=1", "mix:base"):
        with pytest.raises(UserError, match="--offline-source: .*expected"):
            S.parse_offline_source(bad)
    with pytest.raises(UserError, match="--offline-source"):
        ReproduceSettings(offline_source="mix:hot=x").check()


def test_shares_are_floors_then_the_largest_remainders():
    assert S.shares([("base", 0.5), ("reference", 0.5)], 5) == {"base": 3, "reference": 2}  # 2.5, 2.5
    assert S.shares([("base", 0.2), ("hot", 0.3), ("prompted", 0.5)], 4) == {"base": 1, "hot": 1, "prompted": 2}
    assert S.shares([("reference", 1.0)], 8) == {"reference": 8}


def fake_generate(calls: list):
    """Records each call's prompts, n and temperature; writes "t<temperature>" completions."""
    def run(model, tokenizer, prompts, gen):
        calls.append((prompts, gen.n, gen.temperature, gen.seed))
        return SimpleNamespace(texts=[[f"t{gen.temperature}"] * gen.n for _ in prompts],
                               num_generated_tokens=len(prompts) * gen.n)
    return run


def test_each_source_samples_where_it_should_and_the_verifier_scores_every_completion():
    records = sum_records(seed=0, n_train=4, n_held_out=0)[0]
    reward, calls = build_reward("math_verify"), []
    gen = GenerationConfig(n=4, temperature=1.0, seed=7)
    groups, stats = S.offline_groups(None, None, records, "mix:base=1,hot=1,prompted=1,reference=1", gen, reward,
                                     fake_generate(calls))
    assert [(n, t, seed) for _, n, t, seed in calls] == [(1, 1.0, 7), (1, 1.5, 7 + 7919), (1, 1.0, 7 + 2 * 7919)]
    assert calls[0][0] == [r["prompt"] for r in records]  # base: the task's prompts as they are
    assert all(p[0] == {"role": "system", "content": S.TERSE_SYSTEM} and p[1:] == r["prompt"][1:]
               for p, r in zip(calls[2][0], records))  # prompted: another system prompt, the same question
    assert stats["tokens"] == 12 and stats["temperatures"] == {"base": 1.0, "hot": 1.5, "prompted": 1.0}
    for group, record in zip(groups, records):
        assert group["prompt"] == record["prompt"] and group["sources"] == ["base", "hot", "prompted", "reference"]
        assert group["completions"][:3] == ["t1.0", "t1.5", "t1.0"]
        own = group["completions"][3]
        assert f"\\boxed{{{record['answer']}}}" in own  # the sums task asks for \boxed{}
        assert group["scores"] == [0.0, 0.0, 0.0, 1.0]


@pytest.fixture(scope="module")
def tiny():
    tokenizer = make_tokenizer()
    return make_model(tokenizer, hidden_size=32, num_layers=1).eval(), tokenizer


@pytest.mark.parametrize("source", ["base", "hot", "prompted", "reference", "mix:base=0.5,reference=0.5"])
def test_every_source_gives_groups_the_data_layer_reads_and_converts(source, tiny, tmp_path):
    pytest.importorskip("reasoning_gym")
    records = [{"id": r.prompt_id, "prompt": r.prompt, "answer": r.answer, "metadata": r.metadata}
               for r in load_records("reasoning_gym:chain_sum?size=3&held_out=0&max_digits=1", kind="prompts").records]
    model, tokenizer = tiny
    gen = GenerationConfig(n=4, max_new_tokens=4, temperature=1.0, seed=0, batch_size=4)
    groups, _ = S.offline_groups(model, tokenizer, records, source, gen, build_reward("reasoning_gym"), generate)
    path = write_jsonl(tmp_path / "groups.jsonl", [D.without_empty(g) for g in groups])
    loaded = load_records(path, kind="groups").records
    assert len(loaded) == 3 and all(len(g.completions) == len(g.scores) <= 4 for g in loaded)
    assert all(s in (0.0, 1.0) for g in loaded for s in g.scores)
    if "reference" in source:  # the prompt's own answer, in its answer format, scored 1 by the task's verifier
        for group, record in zip(groups, records):
            i = group["completions"].index(next(c for c in group["completions"]
                                                if f"<answer>{record['answer']}</answer>" in c))
            assert group["scores"][i] == 1.0
        options = ConvertOptions(unpaired_rule="best_worst")
        pairs, _ = convert_records(loaded, "groups", "pairwise", options)
        assert pairs and all("<answer>" in p.chosen for p in pairs)
        unpaired, _ = convert_records(loaded, "groups", "unpaired", options)
        assert any(u.desirable for u in unpaired) and any(not u.desirable for u in unpaired)


def test_the_quality_proxy_is_written_next_to_the_data(tmp_path):
    """On a reasoning-gym task's reference groups: `inspect data` reads them like any groups file."""
    pytest.importorskip("reasoning_gym")
    records = [{"id": r.prompt_id, "prompt": r.prompt, "answer": r.answer, "metadata": r.metadata}
               for r in load_records("reasoning_gym:leg_counting?size=4&held_out=0", kind="prompts").records]
    groups = [{"id": r["id"], "prompt": r["prompt"], "completions": c, "scores": [1.0, 0.0]}
              for r, c in zip(records, S.reference_completions(records, 2, 0))]
    write_jsonl(tmp_path / "quality_sample.jsonl", groups)
    quality = D.base_job("quality", ReproduceSettings(model="tiny"), tmp_path)
    D.write_quality(tmp_path / "offline_quality.json", "reference", quality)
    written = json.loads((tmp_path / "offline_quality.json").read_text())
    assert written["source"] == "reference" and written["q25"] <= written["q50"] <= written["q75"]
    assert written["mean"] < 0 and "humanline inspect data" in written["command"]


def test_a_source_other_than_base_has_its_own_key_and_base_keeps_the_old_one():
    plain = ReproduceSettings(model="tiny")
    assert D.offline_key(plain) == D.offline_key(ReproduceSettings(model="tiny", offline_source="base"))
    assert D.offline_key(plain) != D.offline_key(ReproduceSettings(model="tiny", offline_source="reference"))


@pytest.mark.parametrize("source, temperatures, recorded", [("hot", {"hot": S.HOT_TEMPERATURE}, None),
                                                            ("base", {"base": 1.0}, 1.0), ("reference", {}, None)])
def test_the_data_record_names_the_temperature_each_source_drew_at(source, temperatures, recorded, tmp_path):
    """offline.json's temperature is what was sampled at: hot draws at its own temperature, the reference at none."""
    settings = ReproduceSettings(model="tiny", offline_source=source, samples_per_prompt=2, max_new_tokens=4, workers=1)
    records = settings.task_spec.records(4, 0)[0]
    made = D.sample_offline(settings, records, tmp_path, log=lambda _: None)
    assert made["temperatures"] == temperatures and made["temperature"] == recorded and made["source"] == source
    assert made["groups"] == 4 and (tmp_path / "offline_groups_all.jsonl").exists()
