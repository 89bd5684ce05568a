"""Placeholder: replaced by the tramer subcommands."""


def register(subparsers) -> None:
    pass
