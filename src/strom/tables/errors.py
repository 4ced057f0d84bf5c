"""What a translator is told about its table, importable without pyiceberg."""


class TableRefused(Exception):
    """A table of the topic's name that Strom does not translate into (not made by Strom for
    this topic, or of another schema): it is left as it is."""


class TableGone(Exception):
    """The table was dropped while a batch was being committed to it."""
