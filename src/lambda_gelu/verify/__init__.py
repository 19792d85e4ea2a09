"""Formal verification of ReLU networks: ``bounds`` (interval and CROWN bounds, and the float rounding bound),
``milp`` (the exact mixed-integer program, robustness around a point), ``polytopes`` (a property's unsafe set, a
union of output polytopes, decided), ``vnnlib`` (VNN-LIB properties read and written) and ``onnx_chain`` (an ONNX
graph read back as the chain the verifier models). numpy and scipy only (onnx to read a graph).
"""
from .bounds import affine_layers, crown_bounds, float_error, interval_bounds, unit_roundoff
from .milp import VerifyResult, pgd_attack, verify_point
from .polytopes import verify_property

__all__ = ["affine_layers", "interval_bounds", "crown_bounds", "float_error", "unit_roundoff", "verify_point",
           "VerifyResult", "pgd_attack", "verify_property"]
