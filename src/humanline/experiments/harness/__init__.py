"""What the demo and the reproduction share: regimes by name (`regimes`) and jobs run side by side
in worker processes of one thread each (`workers`).
"""
