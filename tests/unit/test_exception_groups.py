from byok.exception_groups import first_except, sole


def test_sole_finds_one_kind_alone_or_nested_and_nothing_mixed() -> None:
    refused = OSError(98, "Address already in use")
    assert sole(refused, OSError) is refused
    nested = BaseExceptionGroup("outer", [BaseExceptionGroup("inner", [refused]), OSError("second")])
    assert sole(nested, OSError) is refused
    assert sole(nested, (ValueError, OSError)) is refused
    mixed = BaseExceptionGroup("outer", [refused, KeyboardInterrupt()])
    assert sole(mixed, OSError) is None
    assert sole(ValueError("x"), OSError) is None


def test_first_except_skips_the_ignored_kinds_at_any_depth() -> None:
    failure = RuntimeError("publish failed")
    group = BaseExceptionGroup("outer", [KeyboardInterrupt(), BaseExceptionGroup("inner", [failure])])
    assert first_except(group, KeyboardInterrupt) is failure
    assert first_except(failure, KeyboardInterrupt) is failure
    assert first_except(BaseExceptionGroup("only", [KeyboardInterrupt()]), KeyboardInterrupt) is None
