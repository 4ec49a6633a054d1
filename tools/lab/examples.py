"""Example topologies (YAML text) used by ``zonemeter lab up`` and the tests."""

#: two zones, three nodes: a client and a web/dns server on every node, one Service
#: ``shop/web`` (TCP 80 -> 8080, UDP 53 -> 5353) selecting the three servers.
DEFAULT_TOPOLOGY = """\
options: {mode: flat, ipv6: false}
zones:
  - {name: zone-a, region: region-1}
  - {name: zone-b, region: region-1}
nodes:
  - {name: a1, zone: zone-a, cpu: 4}
  - {name: a2, zone: zone-a, cpu: 4}
  - {name: b1, zone: zone-b, cpu: 4}
pods:
  - {name: client-a1, namespace: shop, node: a1, app: client}
  - {name: client-a2, namespace: shop, node: a2, app: client}
  - {name: client-b1, namespace: shop, node: b1, app: client}
  - name: web-a1
    namespace: shop
    node: a1
    app: web
    ports: [{port: 8080, name: http}, {port: 5353, protocol: UDP, name: dns}]
  - name: web-a2
    namespace: shop
    node: a2
    app: web
    ports: [{port: 8080, name: http}, {port: 5353, protocol: UDP, name: dns}]
  - name: web-b1
    namespace: shop
    node: b1
    app: web
    ports: [{port: 8080, name: http}, {port: 5353, protocol: UDP, name: dns}]
services:
  - name: web
    namespace: shop
    selector: {app: web}
    ports:
      - {name: http, port: 80, targetPort: http}
      - {name: dns, port: 53, targetPort: dns, protocol: UDP}
"""
