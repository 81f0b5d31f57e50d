// The cluster as a layered graph, left to right: Services, their
// EndpointSlices, the pods (or bare addresses) those slices point at, and
// the nodes the pods run on. Pure data in, boxes and edges out, so the
// page only draws and the rules are unit-tested.

export const COLUMNS = ['service', 'slice', 'pod', 'node'];

const SERVICE_NAME = 'kubernetes.io/service-name';

const keyOf = (o) => `${o.metadata.namespace ?? ''}/${o.metadata.name}`;
const byName = (a, b) => keyOf(a).localeCompare(keyOf(b));

function condition(object, type) {
  return (object.status?.conditions ?? []).find((c) => c.type === type)?.status === 'True';
}

export function podState(pod) {
  if (pod.metadata.deletionTimestamp) return 'terminating';
  const phase = pod.status?.phase ?? 'Pending';
  if (phase === 'Failed') return 'failed';
  if (phase === 'Succeeded') return 'done';
  return phase === 'Running' && condition(pod, 'Ready') ? 'ready' : 'pending';
}

function endpointState(endpoint) {
  const c = endpoint.conditions ?? {};
  if (c.terminating) return 'terminating';
  // An absent `ready` means ready (discovery.k8s.io/v1).
  return c.ready === false ? 'pending' : 'ready';
}

function ports(service) {
  return (service.spec?.ports ?? [])
    .map((p) => `${p.port}/${p.protocol ?? 'TCP'}${p.nodePort ? `:${p.nodePort}` : ''}`)
    .join(', ');
}

function containersReady(pod) {
  const statuses = pod.status?.containerStatuses ?? [];
  const ready = statuses.filter((s) => s.ready).length;
  return `${ready}/${pod.spec?.containers?.length ?? statuses.length}`;
}

/**
 * Boxes `{id, kind, namespace, name, detail, state, object, y}` (y in rows,
 * laid out so a box sits level with what it connects to) and edges
 * `{from, to, state}`. At most `limit` pods are drawn; `hidden` counts the rest.
 */
export function topology({ services = [], slices = [], pods = [], nodes = [] }, { limit = 1000 } = {}) {
  const boxes = new Map();
  const edges = [];
  const edgeKeys = new Set();
  // One edge per pair (a slice may list an address twice).
  const connect = (from, to, state) => {
    if (edgeKeys.has(`${from}>${to}`)) return;
    edgeKeys.add(`${from}>${to}`);
    edges.push({ from, to, state });
  };
  const add = (box) => {
    if (!boxes.has(box.id)) boxes.set(box.id, box);
    return boxes.get(box.id);
  };
  const podsByKey = new Map(pods.map((p) => [keyOf(p), p]));
  const nodesByName = new Map(nodes.map((n) => [n.metadata.name, n]));

  // Slices grouped under their Service, in the Services' order.
  const slicesOf = new Map();
  for (const slice of [...slices].sort(byName)) {
    const owner = `${slice.metadata.namespace}/${slice.metadata.labels?.[SERVICE_NAME] ?? ''}`;
    if (!slicesOf.has(owner)) slicesOf.set(owner, []);
    slicesOf.get(owner).push(slice);
  }
  const podOrder = [];
  const placed = new Set();
  let hidden = 0;
  const placePod = (pod) => {
    const key = keyOf(pod);
    if (placed.has(key)) return true;
    if (placed.size >= limit) return false;
    placed.add(key);
    podOrder.push(pod);
    return true;
  };

  for (const service of [...services].sort(byName)) {
    const serviceId = `service/${keyOf(service)}`;
    const own = slicesOf.get(keyOf(service)) ?? [];
    slicesOf.delete(keyOf(service));
    const endpoints = own.flatMap((s) => s.endpoints ?? []);
    const anyReady = endpoints.some((e) => endpointState(e) === 'ready');
    add({
      id: serviceId,
      kind: 'service',
      namespace: service.metadata.namespace,
      name: service.metadata.name,
      detail: [service.spec?.type ?? 'ClusterIP', service.spec?.clusterIP, ports(service)].filter(Boolean).join(' · '),
      state: anyReady || !service.spec?.selector ? 'ready' : 'pending',
      object: service,
    });
    for (const slice of own) addSlice(slice, serviceId);
  }
  // Slices whose Service is gone (or not visible): still drawn.
  for (const rest of slicesOf.values()) for (const slice of rest) addSlice(slice, null);

  function addSlice(slice, serviceId) {
    const sliceId = `slice/${keyOf(slice)}`;
    const endpoints = slice.endpoints ?? [];
    const ready = endpoints.filter((e) => endpointState(e) === 'ready').length;
    add({
      id: sliceId,
      kind: 'slice',
      namespace: slice.metadata.namespace,
      name: slice.metadata.name,
      detail: `${ready}/${endpoints.length} ready · ${slice.addressType ?? ''}`,
      state: ready > 0 ? 'ready' : 'pending',
      object: slice,
    });
    if (serviceId) connect(serviceId, sliceId, ready > 0 ? 'ready' : 'pending');
    for (const endpoint of endpoints) {
      const target = endpoint.targetRef;
      const pod = target?.kind === 'Pod' && podsByKey.get(`${target.namespace ?? slice.metadata.namespace}/${target.name}`);
      if (pod) {
        if (placePod(pod)) connect(sliceId, `pod/${keyOf(pod)}`, endpointState(endpoint));
        continue;
      }
      // An endpoint that is no visible pod: its address stands in for it.
      for (const address of endpoint.addresses ?? []) {
        const id = `address/${slice.metadata.namespace}/${address}`;
        add({ id, kind: 'address', namespace: slice.metadata.namespace, name: address, detail: target ? `${target.kind} ${target.name}` : 'no pod', state: endpointState(endpoint), object: null });
        connect(sliceId, id, endpointState(endpoint));
      }
    }
  }

  // Pods no Service selects, grouped by node.
  const rest = pods.filter((p) => !placed.has(keyOf(p)));
  rest.sort((a, b) => (a.spec?.nodeName ?? '').localeCompare(b.spec?.nodeName ?? '') || byName(a, b));
  for (const pod of rest) if (!placePod(pod)) hidden += 1;

  for (const pod of podOrder) {
    const podId = `pod/${keyOf(pod)}`;
    add({
      id: podId,
      kind: 'pod',
      namespace: pod.metadata.namespace,
      name: pod.metadata.name,
      detail: [pod.status?.podIP, `${pod.status?.phase ?? 'Pending'} ${containersReady(pod)}`].filter(Boolean).join(' · '),
      state: podState(pod),
      object: pod,
    });
    const nodeName = pod.spec?.nodeName;
    if (nodeName) {
      addNode(nodeName);
      connect(podId, `node/${nodeName}`, 'ready');
    }
  }
  for (const node of [...nodes].sort(byName)) addNode(node.metadata.name);

  function addNode(name) {
    const node = nodesByName.get(name);
    const address = (node?.status?.addresses ?? []).find((a) => a.type === 'InternalIP')?.address;
    add({
      id: `node/${name}`,
      kind: 'node',
      namespace: '',
      name,
      detail: [address, node ? (condition(node, 'Ready') ? 'Ready' : 'NotReady') : 'not visible'].filter(Boolean).join(' · '),
      state: !node ? 'unknown' : condition(node, 'Ready') ? 'ready' : 'failed',
      object: node ?? null,
    });
  }

  layout(boxes, edges);
  return { boxes: [...boxes.values()], edges, hidden };
}

/**
 * Rows: the pod column is the spine (one row each); a slice sits at the
 * mean row of its pods, a Service at the mean of its slices, a node at the
 * mean of its pods; then each column is pushed apart so no two boxes overlap,
 * keeping their order.
 */
function layout(boxes, edges) {
  const column = (kind) => [...boxes.values()].filter((b) => (kind === 'pod' ? b.kind === 'pod' || b.kind === 'address' : b.kind === kind));
  const neighbours = (id, direction) =>
    edges.filter((e) => (direction === 'right' ? e.from === id : e.to === id)).map((e) => boxes.get(direction === 'right' ? e.to : e.from));
  const mean = (list, fallback) => {
    const ys = list.filter((b) => b && b.y !== undefined).map((b) => b.y);
    return ys.length ? ys.reduce((a, b) => a + b, 0) / ys.length : fallback;
  };
  const spread = (list) => {
    let next = 0;
    for (const box of list) {
      box.y = Math.max(box.y, next);
      next = box.y + 1;
    }
  };
  column('pod').forEach((box, row) => (box.y = row));
  for (const kind of ['slice', 'service']) {
    const list = column(kind);
    let last = 0;
    for (const box of list) {
      box.y = mean(neighbours(box.id, 'right'), last);
      last = box.y + 1;
    }
    spread(list);
  }
  const nodes = column('node');
  let last = 0;
  for (const box of nodes) box.y = mean(neighbours(box.id, 'left'), Infinity);
  // Nodes with no pods go below the rest, in name order.
  nodes.sort((a, b) => a.y - b.y);
  for (const box of nodes) {
    if (box.y === Infinity) box.y = last;
    last = box.y + 1;
  }
  spread(nodes);
}
