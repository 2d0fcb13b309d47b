"""scapy view of the wire format: an ``INA`` layer bound to the INA UDP port."""

from scapy.fields import (ByteEnumField, ByteField, FieldListField, FlagsField, IntField,
                          MultipleTypeField, ShortField, SignedByteField, SignedIntField,
                          SignedShortField, XIntField, XLongField)
from scapy.layers.inet import UDP
from scapy.packet import Packet, bind_layers

from .fields import HEADER_FIELDS, INA_UDP_PORT, VERSION, WIDTH_CODES

__all__ = ["INA"]


def _scapy_field(f):
    if f.enum is not None:
        assert f.bits == 8
        return ByteEnumField(f.name, 0, {m.value: m.name for m in f.enum})
    if f.flags is not None:
        return FlagsField(f.name, 0, f.bits, [m.name for m in sorted(f.flags, key=int)])
    if f.name == "bitmap":
        return XIntField(f.name, 0)
    if f.name == "session":
        return XLongField(f.name, 0)
    table = {(8, False): ByteField, (8, True): SignedByteField,
             (16, False): ShortField, (32, False): IntField}
    return table[(f.bits, f.signed)](f.name, VERSION if f.name == "version" else 0)


class INA(Packet):
    name = "INA"
    # the elements' width is the ``width`` byte's low nibble (int32 by default)
    fields_desc = [_scapy_field(f) for f in HEADER_FIELDS] + [
        MultipleTypeField(
            [(FieldListField("elements", [], SignedShortField("", 0),
                             count_from=lambda pkt: pkt.nelem),
              lambda pkt: pkt.width is not None and pkt.width & 0xF == WIDTH_CODES[16]),
             (FieldListField("elements", [], SignedByteField("", 0),
                             count_from=lambda pkt: pkt.nelem),
              lambda pkt: pkt.width is not None and pkt.width & 0xF == WIDTH_CODES[8])],
            FieldListField("elements", [], SignedIntField("", 0),
                           count_from=lambda pkt: pkt.nelem)),
    ]

    def post_build(self, p, pay):
        return p + pay


bind_layers(UDP, INA, dport=INA_UDP_PORT)
bind_layers(UDP, INA, sport=INA_UDP_PORT)
