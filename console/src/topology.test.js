import assert from 'node:assert/strict';
import { test } from 'node:test';

import { podState, topology } from './topology.js';

const meta = (name, namespace = 'default', extra = {}) => ({ metadata: { name, namespace, ...extra } });
const ready = { conditions: [{ type: 'Ready', status: 'True' }] };
const pod = (name, node, state = 'ready') => ({
  ...meta(name),
  spec: { nodeName: node, containers: [{ name: 'c' }] },
  status: state === 'ready' ? { phase: 'Running', podIP: '10.244.0.5', ...ready } : { phase: 'Pending' },
});
const slice = (name, service, endpoints) => ({
  ...meta(name, 'default', { labels: { 'kubernetes.io/service-name': service } }),
  addressType: 'IPv4',
  endpoints,
});
const endpoint = (podName, isReady = true) => ({
  addresses: ['10.244.0.5'],
  conditions: { ready: isReady },
  targetRef: { kind: 'Pod', name: podName, namespace: 'default' },
});

test('Service → slice → pods → node, with readiness on the edges', () => {
  const graph = topology({
    services: [{ ...meta('web'), spec: { type: 'ClusterIP', clusterIP: '10.96.0.20', selector: { app: 'web' }, ports: [{ port: 80 }] } }],
    slices: [slice('web-abc', 'web', [endpoint('web-1'), endpoint('web-2', false)])],
    pods: [pod('web-1', 'n1'), pod('web-2', 'n1', 'pending'), pod('lonely', 'n2')],
    nodes: [{ ...meta('n1', undefined), status: { ...ready, addresses: [{ type: 'InternalIP', address: '192.0.2.1' }] } }],
  });
  const ids = graph.boxes.map((b) => b.id);
  assert.deepEqual(ids.sort(), [
    'node/n1', 'node/n2', 'pod/default/lonely', 'pod/default/web-1', 'pod/default/web-2', 'service/default/web', 'slice/default/web-abc',
  ]);
  const edge = (from, to) => graph.edges.find((e) => e.from === from && e.to === to);
  assert.equal(edge('service/default/web', 'slice/default/web-abc').state, 'ready');
  assert.equal(edge('slice/default/web-abc', 'pod/default/web-1').state, 'ready');
  assert.equal(edge('slice/default/web-abc', 'pod/default/web-2').state, 'pending');
  assert.ok(edge('pod/default/lonely', 'node/n2'));
  const box = (id) => graph.boxes.find((b) => b.id === id);
  assert.equal(box('service/default/web').detail, 'ClusterIP · 10.96.0.20 · 80/TCP');
  assert.equal(box('slice/default/web-abc').detail, '1/2 ready · IPv4');
  assert.equal(box('node/n1').detail, '192.0.2.1 · Ready');
  // A node the user may not read is drawn all the same.
  assert.equal(box('node/n2').state, 'unknown');
  // Served pods first, level with their slice and Service.
  assert.equal(box('pod/default/web-1').y, 0);
  assert.equal(box('slice/default/web-abc').y, 0.5);
  assert.equal(box('service/default/web').y, 0.5);
  assert.equal(box('pod/default/lonely').y, 2);
});

test('boxes in a column never overlap', () => {
  const services = ['a', 'b', 'c'].map((n) => ({ ...meta(n), spec: { selector: { app: n } } }));
  const slices = ['a', 'b', 'c'].map((n) => slice(`${n}-1`, n, [endpoint('shared')]));
  const graph = topology({ services, slices, pods: [pod('shared', 'n1')] });
  const ys = graph.boxes.filter((b) => b.kind === 'service').map((b) => b.y).sort();
  assert.deepEqual(ys, [0, 1, 2]);
});

test('endpoints without a visible pod show their address', () => {
  const manual = { ...slice('ext-1', 'ext', [{ addresses: ['192.0.2.9'] }]) };
  const graph = topology({ services: [{ ...meta('ext'), spec: {} }], slices: [manual] });
  assert.ok(graph.boxes.some((b) => b.id === 'address/default/192.0.2.9'));
  assert.equal(graph.boxes.find((b) => b.kind === 'service').state, 'ready');
});

test('at most `limit` pods, the rest counted', () => {
  const pods = Array.from({ length: 5 }, (_, i) => pod(`p${i}`, 'n1'));
  const graph = topology({ pods }, { limit: 3 });
  assert.equal(graph.boxes.filter((b) => b.kind === 'pod').length, 3);
  assert.equal(graph.hidden, 2);
});

test('pod states', () => {
  assert.equal(podState(pod('a', 'n')), 'ready');
  assert.equal(podState(pod('a', 'n', 'pending')), 'pending');
  assert.equal(podState({ ...meta('a', 'd', { deletionTimestamp: 'x' }) }), 'terminating');
  assert.equal(podState({ ...meta('a'), status: { phase: 'Failed' } }), 'failed');
});
