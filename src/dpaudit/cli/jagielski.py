"""Placeholder: replaced by the jagielski subcommands."""


def register(subparsers) -> None:
    pass
