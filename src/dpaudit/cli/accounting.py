"""Placeholder: replaced by the accounting subcommands."""


def register(subparsers) -> None:
    pass
