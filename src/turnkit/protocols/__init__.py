"""Adapters from turnkit events to UI streaming protocols."""

__all__ = ()
