"""The exceptions the CLI prints as one line, no traceback: each has its own exit status."""


class UserError(ValueError):
    """Bad input the user can fix; the message names the file, model, tensor or field."""


class MeasurementError(RuntimeError):
    """A built-in precheck diagnostic could not measure: the precheck fails closed (exit 3)."""
