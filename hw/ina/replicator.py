"""Multicast replicator: turns a RESULT request into output datagrams.

A request names a slot record (its accumulators stay in the aggregator's block RAM) and
a snapshot of the record's header fields. A group request becomes one copy per member
(unicast: destination MAC/IP/port rewritten, IPv4 header checksum recomputed), or one
copy to the job's IP multicast group (MAC 01:00:5e + low 23 bits of the group address),
as the job table says. A re-send request becomes one unicast copy to the asking worker,
with the RETRANSMIT flag and the worker field set to that worker. The 37-bit
accumulators are saturated to int32 on the way out.

The L2/L3 headers are built by the front end (hw/eth) from the output beat's sideband:
``dst_mac``, ``dst_ip``, ``dst_port``, ``length`` and ``ip_checksum`` (of the template
in :func:`ipv4_header`).
"""

import struct

from amaranth.hdl import *

__all__ = ["ipv4_header", "ipv4_checksum", "ip_checksum_hw", "mcast_mac", "saturate32"]

IP_FLAGS_DF = 0x4000
IP_TTL_PROTO = (64 << 8) | 17


def ipv4_header(src_ip: int, dst_ip: int, udp_payload_len: int) -> bytes:
    """The IPv4 header the front end must emit for a RESULT copy (checksum filled)."""
    total = 20 + 8 + udp_payload_len
    hdr = struct.pack(">BBHHHBBHII", 0x45, 0, total, 0, IP_FLAGS_DF, 64, 17, 0, src_ip, dst_ip)
    csum = ipv4_checksum(hdr)
    return hdr[:10] + struct.pack(">H", csum) + hdr[12:]


def ipv4_checksum(header: bytes) -> int:
    s = sum(struct.unpack(f">{len(header) // 2}H", header))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def ip_checksum_hw(src_ip, dst_ip, total_len):
    """Amaranth expression: checksum of the :func:`ipv4_header` template."""
    const = 0x4500 + IP_FLAGS_DF + IP_TTL_PROTO
    s = (Const(const, 20) + total_len + src_ip[16:32] + src_ip[0:16]
         + dst_ip[16:32] + dst_ip[0:16])
    s1 = s[0:16] + s[16:]
    s2 = s1[0:16] + s1[16:]
    return ~s2[0:16]


def mcast_mac(ip):
    """Amaranth expression: the 01:00:5e multicast MAC of an IPv4 group address."""
    return Cat(ip[0:23], Const(0, 1), Const(0x01005E, 24))


def saturate32(v):
    """Amaranth expression: signed ``v`` clamped to int32, as 32 bits; and whether it
    was clamped."""
    hi = v >= (1 << 31)
    lo = v < -(1 << 31)
    out = Mux(hi, Const(0x7FFFFFFF, 32), Mux(lo, Const(0x80000000, 32), v[0:32]))
    return out, hi | lo
