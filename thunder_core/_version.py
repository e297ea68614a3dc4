"""The version of thunder-core (and of its plugin API, ``thunder_core.extend``)."""

__version__ = "0.2.0"
