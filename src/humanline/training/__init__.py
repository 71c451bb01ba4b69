"""The training loop and what it is built from: the run's assembly (`build`), the loop (`loop.Trainer`), the
objective table (`objective_table`), reference strategies, the data schedule, checkpoints, faults,
counters, held-out evaluation during training (`held_out`), the run folder and its logs; and reading
a recipe into a checked `Config` (`config_loading`, `config_checks`, `yaml_io`).
"""
