"""Placeholder: replaced by the hw3 subcommands."""


def register(subparsers) -> None:
    pass
