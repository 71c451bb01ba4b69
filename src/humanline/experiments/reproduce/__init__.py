"""`humanline reproduce smollm2`: the paper's comparison on a real language model, on a CPU.

SmolLM2-135M-Instruct is aligned on a verifiable arithmetic task (`task`) under each data regime — offline
data sampled once from the base policy, offline + humanline, online, sparse-online + humanline — for GRPO, DPO
and KTO, several seeds each (`settings`). Data preparation is cached (`data`), every run is resumable and a
finished run is never repeated (`runs`), and `results` turns the runs into the table, paired comparisons by
seed, wall-clock to online's final pass@1, `results.json`, `report.md` and plots.
"""
