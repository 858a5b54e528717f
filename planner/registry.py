"""A named registry of interchangeable classes (solvers, estimators)."""
from __future__ import annotations

from typing import Any, Generic, TypeVar

from planner.errors import UnknownNameError

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
    """Classes by their ``name`` attribute; ``kind`` names them in error messages."""

    def __init__(self, kind: str, classes: tuple[type[T], ...] = ()) -> None:
        self.kind = kind
        self._classes: dict[str, type[T]] = {}
        for cls in classes:
            self.register(cls)

    def register(self, cls: type[T]) -> type[T]:
        """Add ``cls`` under ``cls.name`` (usable as a decorator)."""
        self._classes[cls.name] = cls
        return cls

    def names(self) -> list[str]:
        return sorted(self._classes)

    def create(self, name: str, **options: Any) -> T:
        """A new instance by name, with ``options`` passed to its constructor.

        Raises
        ------
        UnknownNameError
            If no class has that name; the message lists the available ones.
        """
        try:
            cls = self._classes[name]
        except (KeyError, TypeError):
            raise UnknownNameError(self.kind, str(name), self.names()) from None
        return cls(**options)
