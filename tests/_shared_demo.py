"""One demo data root per test session for the tool tests that only read it (the first tool run writes it, under
a file lock; later runs find it complete)."""


def shared_demo_root(tmp_path_factory, subset='imagenet') -> str:
    return str(tmp_path_factory.getbasetemp() / 'shared_demo' / 'data' / 'demo' / subset)
