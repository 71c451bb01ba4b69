"""The subcommands of `humanline`, one module each: argument parsing and a handler that calls the library.

Every module has `add_parser(subparsers)`, which registers its subcommand and sets `args.func` to the
handler; a handler returns the process exit code. `humanline.cli` imports each module directly, so a broken
command fails at start-up instead of disappearing from the help.
"""
