"""What the demo and the reproduction share, written once: regimes by name (`regimes`), jobs side by side in
worker processes of one thread each (`workers`), a run's plan, folder, config and metrics and the time left
(`runs`), results grouped by regime with the curve figures and the files written (`results`), and the checks of
the flags both commands take (`command`).
"""
