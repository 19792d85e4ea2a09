"""The modules that moved when the library was grouped by concern still import by their old names, for one release,
with a warning that names the new home, and give the same objects."""
import importlib
import sys

import pytest

from lambda_gelu._moved import MOVED


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_name_forwards_to_the_new_module(old):
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=MOVED[old].replace(".", r"\.")):
        module = importlib.import_module(old)
    new = importlib.import_module(MOVED[old])
    public = [n for n in dir(new) if not n.startswith("__")]
    try:
        assert public and all(getattr(module, n) is getattr(new, n) for n in public)
    finally:  # no old name left behind as an attribute that other tests could lean on
        parent, leaf = old.rsplit(".", 1)
        sys.modules.pop(old)
        if getattr(sys.modules[parent], leaf, None) is module:
            delattr(sys.modules[parent], leaf)


def test_deploy_names_of_the_one_module_it_was():
    from lambda_gelu.deploy import onnx
    with pytest.warns(DeprecationWarning, match="deploy.onnx.export_onnx"):
        from lambda_gelu.deploy import export_onnx
    assert export_onnx is onnx.export_onnx
    with pytest.raises(AttributeError):
        importlib.import_module("lambda_gelu.deploy").__getattr__("no_such_name")
