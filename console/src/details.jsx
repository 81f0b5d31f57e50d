// The selected object: a summary for its kind, a pod's logs, and the
// object itself as the API returned it.

import { Logs } from './logs.jsx';

function Fields({ rows }) {
  return (
    <dl>
      {rows
        .filter(([, value]) => value !== undefined && value !== null && value !== '')
        .map(([label, value]) => [<dt key={`${label}-t`}>{label}</dt>, <dd key={`${label}-d`}>{value}</dd>])}
    </dl>
  );
}

const pairs = (map) =>
  Object.entries(map ?? {})
    .map(([k, v]) => `${k}=${v}`)
    .join(', ');

function summary(box) {
  const o = box.object;
  switch (box.kind) {
    case 'service':
      return [
        ['Type', o.spec?.type ?? 'ClusterIP'],
        ['Cluster IPs', (o.spec?.clusterIPs ?? [o.spec?.clusterIP]).filter(Boolean).join(', ')],
        ['Ports', (o.spec?.ports ?? []).map((p) => `${p.name ? `${p.name} ` : ''}${p.port}→${p.targetPort ?? p.port}/${p.protocol ?? 'TCP'}`).join(', ')],
        ['Selector', pairs(o.spec?.selector)],
        ['DNS name', `${o.metadata.name}.${o.metadata.namespace}.svc`],
      ];
    case 'slice':
      return [
        ['Service', o.metadata.labels?.['kubernetes.io/service-name']],
        ['Endpoints', (o.endpoints ?? []).map((e) => `${(e.addresses ?? []).join(',')}${e.conditions?.ready === false ? ' (not ready)' : ''}`).join(', ')],
        ['Ports', (o.ports ?? []).map((p) => `${p.name ? `${p.name} ` : ''}${p.port}/${p.protocol ?? 'TCP'}`).join(', ')],
      ];
    case 'pod':
      return [
        ['Phase', o.status?.phase],
        ['Pod IP', o.status?.podIP],
        ['Node', o.spec?.nodeName],
        ['Labels', pairs(o.metadata.labels)],
        [
          'Containers',
          (o.status?.containerStatuses ?? []).map((c) => `${c.name}: ${Object.keys(c.state ?? {})[0] ?? '?'}${c.ready ? ', ready' : ''}, ${c.restartCount} restarts`).join('; '),
        ],
      ];
    case 'node':
      return [
        ['Addresses', (o.status?.addresses ?? []).map((a) => `${a.type} ${a.address}`).join(', ')],
        ['Pod CIDR', o.spec?.podCIDR],
        ['Conditions', (o.status?.conditions ?? []).map((c) => `${c.type}=${c.status}`).join(', ')],
        ['Capacity', pairs(o.status?.capacity)],
        ['Version', o.status?.nodeInfo?.kubeletVersion],
      ];
    default:
      return [];
  }
}

export function Details({ box, onClose }) {
  const title = box.namespace ? `${box.namespace}/${box.name}` : box.name;
  return (
    <div class="detail-panel" data-selected={box.id}>
      <header>
        <h2>
          <span class="kind">{box.kind}</span> {title}
        </h2>
        <button aria-label="Close" onClick={onClose}>
          ×
        </button>
      </header>
      {box.object ? <Fields rows={summary(box)} /> : <p class="note">{box.detail}</p>}
      {box.kind === 'pod' && box.object && <Logs pod={box.object} />}
      {box.object && (
        <details>
          <summary>Object</summary>
          <pre>{JSON.stringify(box.object, null, 2)}</pre>
        </details>
      )}
    </div>
  );
}
