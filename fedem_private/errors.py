"""The one exception type that means "the user gave us something wrong"."""


class UserError(Exception):
    """Bad input from the user: reported as one line on stderr, exit code 2, no traceback."""


class Diverged(UserError):
    """A run's numbers became NaN or Inf (usually a learning rate too large).

    For one run it is a user error like any other (one line, exit 2); a tuning
    study records the trial as diverged and goes on to the next.
    """
