"""Write the int8 prefilter's kernel (`store/prefilter.py`): one ONNX MatMulInteger node, uint8 rows (n, k)
times int8 queries (k, m) into int32 (n, m), which onnxruntime runs with its fast integer kernel. Needs the
`onnx` package (the [train] or [fast] extra); the file it writes ships with toolscout, so searches do not.

    python scripts/make_matmul_integer.py   # writes src/toolscout/data/kernels/matmul_integer.onnx
"""

from pathlib import Path

from onnx import TensorProto, checker, helper

TARGET = Path(__file__).resolve().parent.parent / "src" / "toolscout" / "data" / "kernels" / "matmul_integer.onnx"


def main() -> None:
    rows = helper.make_tensor_value_info("rows", TensorProto.UINT8, ["n", "k"])
    queries = helper.make_tensor_value_info("queries", TensorProto.INT8, ["k", "m"])
    scores = helper.make_tensor_value_info("scores", TensorProto.INT32, ["n", "m"])
    node = helper.make_node("MatMulInteger", ["rows", "queries"], ["scores"])
    model = helper.make_model(helper.make_graph([node], "matmul_integer", [rows, queries], [scores]),
                              opset_imports=[helper.make_opsetid("", 10)], producer_name="toolscout")
    model.ir_version = 7  # onnxruntime 1.17 (the oldest toolscout accepts) reads it
    checker.check_model(model)
    TARGET.parent.mkdir(parents=True, exist_ok=True)
    TARGET.write_bytes(model.SerializeToString())
    print(f"wrote {TARGET} ({TARGET.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
