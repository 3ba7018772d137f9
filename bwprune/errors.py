"""The one exception type for bad user input.

`run.py` prints a `UserError` as a single line and exits with status 2; anything else is a bug and
keeps its traceback. Messages name the bad value and, where the set is finite, the valid choices.
"""


class UserError(ValueError):
    """A configuration, path or data problem the user can fix."""


def check_sparsity(sparsity: float) -> None:
    """ρ in [0, 1): every method's target (and the run's `sparsity`) is a fraction of something
    dropped, never all of it."""
    if not 0.0 <= sparsity < 1.0:
        raise UserError(f"sparsity={sparsity} is outside [0, 1)")


def choices_error(key: str, value: object, choices: "list[str] | tuple[str, ...]") -> UserError:
    """`key=value` is not one of `choices`."""
    return UserError(f"{key}={value!r} is not valid; choose one of {sorted(choices)}")
