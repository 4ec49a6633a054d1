"""Project exceptions.

Bad input never surfaces as a traceback: it raises :class:`InputError`, which names
the file, the object and the field, and the CLI prints it as one line and exits 2.
"""

from __future__ import annotations


class ZonemeterError(Exception):
    """Base class of every error zonemeter raises on purpose."""


class InputError(ZonemeterError):
    """Bad input from a user-supplied file, flag or Kubernetes object.

    Attributes:
        source: where the input came from (a file path, ``--flag`` name, or ``"api"``).
        obj: the object inside it (``"Service shop/cart"``, ``"line 3"``), or ``None``.
        field: the field path inside the object (``"spec.ports[0].port"``), or ``None``.
        problem: what is wrong, in a few words.

    ``str(err)`` is a single line: ``source: obj: field: problem``.
    """

    def __init__(self, problem: str, *, source: str | None = None, obj: str | None = None,
                 field: str | None = None) -> None:
        self.problem = problem
        self.source = source
        self.obj = obj
        self.field = field
        super().__init__(self._line())

    def _line(self) -> str:
        parts = [p for p in (self.source, self.obj, self.field) if p]
        text = ": ".join(parts + [self.problem])
        return " ".join(text.split())  # always one line

    def with_source(self, source: str) -> InputError:
        """Return a copy of this error that names ``source`` (when it named none)."""
        return InputError(self.problem, source=self.source or source, obj=self.obj, field=self.field)


class RuntimeFailure(ZonemeterError):
    """A failure of the environment (kernel, network, API server): CLI exit code 1."""
