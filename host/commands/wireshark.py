"""Print a Wireshark Lua dissector for INA traffic.

    ina wireshark > ~/.local/lib/wireshark/plugins/ina.lua
"""

from ina_fabric.protocol.fields import INA_UDP_PORT

HELP = "print the Wireshark Lua dissector for the INA header"


def add_arguments(p):
    p.add_argument("--port", type=int, default=INA_UDP_PORT,
                   help="UDP port to register the dissector on")


def run(args):
    from ina_fabric.protocol.wireshark import lua_dissector
    print(lua_dissector(args.port), end="")
