"""Overload: a saturated node sheds low-priority checks instead of queuing
everyone (README, "Overload").

  subsystem.py  the meter's settings (shed-threshold, shed-lag-ms,
                shed-normal-lag-ms), the probe timer, INFO's shedding
                section and fields of stats, the bounded log of level
                changes, the figures /metrics and the status page show

The kernel parts it uses: ``fl_load.h`` and ``_load.pyx`` (the meter, in
C), ``ServerCore.load`` (what the check path reads: ``check_bucket``,
``check_limit`` in ``_protocol_checks.pxi``) and the RESP front's reading
order (``Connection.data_received``, ``ServerCore.drain_held``).
"""
