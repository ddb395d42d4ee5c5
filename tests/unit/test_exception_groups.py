from byok.exception_groups import sole


def test_sole_finds_one_kind_alone_or_nested_and_nothing_mixed() -> None:
    refused = OSError(98, "Address already in use")
    assert sole(refused, OSError) is refused
    nested = BaseExceptionGroup("outer", [BaseExceptionGroup("inner", [refused]), OSError("second")])
    assert sole(nested, OSError) is refused
    assert sole(nested, (ValueError, OSError)) is refused
    mixed = BaseExceptionGroup("outer", [refused, KeyboardInterrupt()])
    assert sole(mixed, OSError) is None
    assert sole(ValueError("x"), OSError) is None
