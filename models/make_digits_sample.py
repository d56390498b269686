"""Writes one held-out scikit-learn digits image as a .npy file for the demo.

Usage: make_digits_sample.py OUT.npy — saves float32 [1, 64] (pixel values
0..16, as the digits MLP takes them): the first image of the builder's own
test split, so the model never saw it in training. Prints its true label.
"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_digits_mlp import load_split  # noqa: E402


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: make_digits_sample.py OUT.npy")
    _, _, x_test, y_test = load_split()
    np.save(sys.argv[1], x_test[:1].astype(np.float32))
    print(f"sample: first held-out digits image, true label {int(y_test[0])} -> {sys.argv[1]}")


if __name__ == "__main__":
    main()
