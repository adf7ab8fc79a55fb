#!/usr/bin/python3
"""Writes the ONNX node conformance cases for kiln's conformance runner (tests/conformance/).

Run at test time, never committed: the cases come from the installed python3-onnx's own case
generators (onnx.backend.test.case.node.collect_testcases, what `backend-test-tools
generate-data` writes), in the same layout: OUT/<case>/model.onnx and
OUT/<case>/test_data_set_N/{input,output}_K.pb (a TensorProto, or a SequenceProto or
OptionalProto for a value of that type, as generate-data writes them). It also writes
OUT/index.tsv, one
line per case: name, op under test, opset, rtol, atol. The op of an "_expanded" case (the op's
function body inlined) is the op of its twin, so both count for that op.

Usage: /usr/bin/python3 generate_cases.py OUT_DIR
"""
import os
import shutil
import sys

import numpy as np

# python3-onnx 1.12 still uses the aliases numpy 1.24 removed; restore them before importing it.
np.float = float
np.int = int
np.bool = bool
np.object = object

import warnings  # noqa: E402

warnings.filterwarnings("ignore")

from onnx import numpy_helper  # noqa: E402
import onnx  # noqa: E402
from onnx.backend.test.case import node as node_cases  # noqa: E402


def to_proto(value, info):
    """The proto generate-data writes for `value` of the declared type `info.type`."""
    t = info.type
    if t.HasField("sequence_type"):
        return numpy_helper.from_list(list(value), info.name)
    if t.HasField("optional_type"):
        inner = t.optional_type.elem_type
        dtype = (onnx.OptionalProto.SEQUENCE if inner.HasField("sequence_type")
                 else onnx.OptionalProto.TENSOR)
        return numpy_helper.from_optional(value, info.name, dtype)
    if isinstance(value, onnx.TensorProto):  # a case that built its tensor itself
        proto = onnx.TensorProto()
        proto.CopyFrom(value)
        proto.name = info.name
        return proto
    proto = numpy_helper.from_array(np.asarray(value), info.name)
    # numpy has no bfloat16: the cases hold its bits as uint16 where the model declares
    # BFLOAT16; the proto says what the bits are.
    if (t.tensor_type.elem_type == onnx.TensorProto.BFLOAT16
            and proto.data_type == onnx.TensorProto.UINT16):
        proto.data_type = onnx.TensorProto.BFLOAT16
    return proto


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = sys.argv[1]
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    cases = node_cases.collect_testcases(None)
    op_of = {}
    for case in cases:
        if len(case.model.graph.node) == 1:
            op_of[case.name] = case.model.graph.node[0].op_type
    # A few generators share a case name; like generate-data, the last one written wins.
    unique = {case.name: case for case in cases}
    lines = []
    for name in sorted(unique):
        case = unique[name]
        base = case.name[: -len("_expanded")] if case.name.endswith("_expanded") else case.name
        op = op_of.get(base) or op_of.get(case.name)
        if op is None:  # an expanded case without a twin: name the first op of its body
            op = case.model.graph.node[0].op_type if case.model.graph.node else "?"
        opset = max((o.version for o in case.model.opset_import if o.domain in ("", "ai.onnx")),
                    default=0)
        case_dir = os.path.join(tmp, case.name)
        os.makedirs(case_dir)
        with open(os.path.join(case_dir, "model.onnx"), "wb") as f:
            f.write(case.model.SerializeToString())
        for i, (inputs, outputs) in enumerate(case.data_sets):
            data_dir = os.path.join(case_dir, f"test_data_set_{i}")
            os.makedirs(data_dir)
            for kind, values, infos in (("input", inputs, case.model.graph.input),
                                        ("output", outputs, case.model.graph.output)):
                for j, value in enumerate(values):
                    path = os.path.join(data_dir, f"{kind}_{j}.pb")
                    with open(path, "wb") as f:
                        f.write(to_proto(value, infos[j]).SerializeToString())
        lines.append(f"{case.name}\t{op}\t{opset}\t{case.rtol!r}\t{case.atol!r}\n")
    with open(os.path.join(tmp, "index.tsv"), "w") as f:
        f.write(f"# onnx {onnx.__version__} node cases: name, op, opset, rtol, atol\n")
        f.writelines(lines)
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)
    print(f"generate_cases: {len(lines)} node cases from onnx {onnx.__version__} in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
