"""The one exception type that means "the user gave us something wrong"."""


class UserError(Exception):
    """Bad input from the user: reported as one line on stderr, exit code 2, no traceback."""


class Diverged(UserError):
    """A run's numbers became NaN or Inf (usually a learning rate too large).

    For one run it is a user error like any other (one line, exit 2); a tuning
    study records the trial as diverged and goes on to the next.
    """


class ResultsElsewhere(UserError):
    """A run finished, but another run had meanwhile finished into the folder it was given
    (two runs started together with one ``--out``): its results were kept whole in
    ``path``, beside it. A caller that can say so (the ``run`` command, :func:`fedem_private.
    api.run`) reads them there and goes on; any other reports the line like a user error."""

    def __init__(self, message: str, path: object) -> None:
        super().__init__(message)
        self.path = path
