"""A model or a run judged afterwards: samples on held-out prompts scored into reward, pass@k and win rate
(`generations`, `humanline eval`), and a run's report from its metrics (`run_report`,
`humanline report`).
"""
