"""Real CUDA streams and events; operations run as they are issued."""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import torch

from harness.device.base import Device, Event, Stream


class CudaDevice(Device):
    kind = "cuda"

    def __init__(self) -> None:
        self._streams: dict[int, torch.cuda.Stream] = {}
        super().__init__()
        self._warm_up()

    @property
    def torch_device(self) -> torch.device:
        return torch.device("cuda")

    def new_stream(self, name: str) -> Stream:
        stream = super().new_stream(name)
        self._streams[stream.id] = torch.cuda.Stream()
        return stream

    @contextlib.contextmanager
    def stream(self, stream: Stream) -> Iterator[Stream]:
        """Also torch's current stream: tensors the target allocates belong to the stream that uses them."""
        with super().stream(stream), torch.cuda.stream(self._streams[stream.id]):
            yield stream

    def native(self, stream: Stream) -> torch.cuda.Stream:
        return self._streams[stream.id]

    def _issue(self, stream: Stream, op: str, fn: Callable[[], None]) -> None:
        with torch.cuda.stream(self._streams[stream.id]):
            fn()

    def _record(self, event: Event, stream: Stream) -> None:
        native = torch.cuda.Event()
        native.record(self._streams[stream.id])
        event.native = native

    def _wait(self, stream: Stream, event: Event) -> None:
        if event.native is not None:
            self._streams[stream.id].wait_event(event.native)

    def _synchronize(self) -> None:
        torch.cuda.synchronize()

    def delay(self, cycles: int) -> None:
        if cycles:
            self.delays.append(cycles)
            with torch.cuda.stream(self._streams[self.current_stream.id]):
                torch.cuda._sleep(cycles)

    def _warm_up(self) -> None:
        """The first trial in a fresh process does not race (stream start-up): warm both streams."""
        for native in self._streams.values():
            with torch.cuda.stream(native):
                torch.cuda._sleep(1000)
                torch.zeros(1, device="cuda").add_(1)
        torch.cuda.synchronize()
