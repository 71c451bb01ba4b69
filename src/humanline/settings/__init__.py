"""The run's settings: the config dataclasses (`config`), one per concern, each field documented next to its
default. They stand on the lowest floor (they import nothing above `core`), so any module may name
them in a signature; reading and checking a recipe is `humanline.training.config_loading`.
"""
