"""Every CPU op, one module per family. Importing this package registers them all."""

from . import (  # noqa: F401
    attention,
    control,
    conv,
    detection,
    elementwise,
    image,
    linalg,
    logic,
    matmul,
    normalization,
    pool,
    quantize,
    random,
    recurrent,
    reduce,
    resize,
    sequence,
    signal,
    tensor,
    text,
)
