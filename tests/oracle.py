"""What the op tests share: run a serialized model through aiomnn's CPU backend."""

from __future__ import annotations

import asyncio

import numpy as np

import aiomnn


def run_aiomnn(data: bytes, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The model's outputs, in order, from a fresh CPU session."""

    async def run() -> list[np.ndarray]:
        net = aiomnn.Interpreter.from_bytes(data)
        async with await net.create_session(aiomnn.ScheduleConfig(type="cpu")) as session:
            out = await session.run(feeds)
        return [out[name] for name in net.output_names]

    return asyncio.run(run())
