"""Writes the small .npy/.npz fixtures that tests/test_data.c reads, with real numpy,
so the C reader is checked against what numpy actually produces (header padding,
zip64 local headers in .npz, deflate). Values are simple formulas the test
recomputes. Run from the repository root: .venv/bin/python tests/data/make_npy_fixtures.py"""
import os
import numpy as np

out = os.path.join(os.path.dirname(os.path.abspath(__file__)))


def save(name, arr, version=None):
    path = os.path.join(out, name)
    with open(path, "wb") as f:
        np.lib.format.write_array(f, arr, version=version)


a = (np.arange(6, dtype=np.float32) * 0.5 - 1).reshape(2, 3)  # v[i] = 0.5 i - 1
save("f4_2x3.npy", a)
save("f4_2x3_v2.npy", a, version=(2, 0))
save("f4_2x3_v3.npy", a, version=(3, 0))
save("f8_fortran_3x4.npy", np.asfortranarray(np.arange(12, dtype=np.float64).reshape(3, 4) / 4))
save("f4_be_2x3.npy", a.astype(">f4"))
save("f2_4.npy", np.array([0.5, -2, 65504, 1e-3], dtype=np.float16))
save("i4_5.npy", np.array([-3, -1, 0, 7, 2**31 - 1], dtype=np.int32))
save("i8_2x2.npy", np.array([[-(2**40), 1], [2, 2**62]], dtype=np.int64))
save("u1_3.npy", np.array([0, 128, 255], dtype=np.uint8))
save("i1_3.npy", np.array([-128, 0, 127], dtype=np.int8))
save("b1_4.npy", np.array([True, False, False, True]))
save("f4_scalar.npy", np.float32(3.25).reshape(()))
save("f4_empty_0x3.npy", np.zeros((0, 3), dtype=np.float32))
save("u2_2.npy", np.array([1, 2], dtype=np.uint16))  # unsupported dtype

x = (np.arange(12, dtype=np.float32) / 3).reshape(3, 4)
y = np.array([2, 0, 1], dtype=np.int64)
np.savez(os.path.join(out, "xy_stored.npz"), x=x, y=y)
np.savez_compressed(os.path.join(out, "xy_deflated.npz"), x=x, y=y)
