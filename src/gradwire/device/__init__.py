"""The compute model of the simulated cluster (pure): named devices and roofline prices of tensor ops.

- :func:`parse_device` / :class:`DeviceSpec`: ``a100``, ``host:x0.1``, ``19.5/1555``, ``step:35ms``
  (:mod:`.catalog`, where the named devices' figures and their sources are).
- :func:`op_seconds`, :class:`RooflineMode`: what an op takes on a device (:mod:`.roofline`).
- ``profile:DIR[@DEVICE]``: ops priced as the user's own run took them
  (:mod:`.recorded`, the recordings of ``gradwire profile --ops``).

The backend's simulated clock (:mod:`gradwire.backend.simclock`) charges a
rank's compute through these; nothing here knows of process groups.
"""
from __future__ import annotations

from gradwire.device.catalog import DEVICES, SPEC_KINDS, Device, DeviceSpec, parse_device, register_spec_kind
from gradwire.device.recorded import Recording, load_recording, model_signature, op_key
from gradwire.device.roofline import RooflineMode, op_cost, op_seconds

__all__ = ["DEVICES", "SPEC_KINDS", "Device", "DeviceSpec", "Recording", "RooflineMode", "load_recording",
           "model_signature", "op_cost", "op_key", "op_seconds", "parse_device", "register_spec_kind"]
