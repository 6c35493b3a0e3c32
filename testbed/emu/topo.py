"""A FabricSpec (testbed.topo) as a Mininet topology: `FabricTopo`, and `SingleTopo`,
`LeafSpineTopo` and `RailTopo`, its parametrised forms, Mininet style."""

from __future__ import annotations

from mininet.topo import Topo

from testbed.topo import (
    COLLECTOR_IP,
    COLLECTOR_MAC,
    COLLECTOR_NODE,
    FabricSpec,
    NicSpec,
    leafspine,
    rail,
    single,
)


class FabricTopo(Topo):
    """A FabricSpec as a Mininet topology. Node options carry what the testbed's node
    classes need: switches their device id, node id and router MAC; hosts their NICs."""

    def build(self, spec: FabricSpec, mtu: int = 9000) -> None:  # type: ignore[override]
        self.spec = spec
        for s in spec.switches:
            self.addSwitch(
                s.name,
                dpid=f"{s.device_id:016x}",
                device_id=s.device_id,
                node_id=s.node_id,
                router_mac=s.router_mac,
            )
        for h in spec.hosts:
            nics = tuple(
                _nic_params(spec, n, spec.attachment(h.name, i).node) for i, n in enumerate(h.nics)
            )
            self.addHost(h.name, ip=None, nics=nics, mtu=mtu)
        for lk in spec.links:
            self.addLink(lk.a.node, lk.b.node, port1=lk.a.index, port2=lk.b.index)
        if spec.collector is not None:
            nic = _nic_params(spec, NicSpec(COLLECTOR_IP, COLLECTOR_MAC), spec.collector.node)
            self.addHost(COLLECTOR_NODE, ip=None, nics=(nic,), mtu=mtu, collector=True)
            self.addLink(COLLECTOR_NODE, spec.collector.node, port1=0, port2=spec.collector.index)


def _nic_params(spec: FabricSpec, nic: NicSpec, switch: str) -> dict[str, str]:
    """What the host node needs to configure a NIC (testbed.emu.nodes.FabricHost)."""
    return {
        "ip": nic.ip,
        "mac": nic.mac,
        "gateway": nic.gateway,
        "subnet": nic.subnet,
        "router_mac": spec.switch(switch).router_mac,
    }


class SingleTopo(FabricTopo):
    def build(self, hosts: int = 4) -> None:  # type: ignore[override]
        super().build(single(hosts))


class LeafSpineTopo(FabricTopo):
    def build(  # type: ignore[override]
        self, leaves: int = 2, spines: int = 2, hosts_per_leaf: int = 4
    ) -> None:
        super().build(leafspine(leaves, spines, hosts_per_leaf))


class RailTopo(FabricTopo):
    def build(self, nics: int = 2, hosts: int = 4, spines: int = 1) -> None:  # type: ignore[override]
        super().build(rail(nics, hosts, spines))
