// Recent events, newest first; only the selected object's when one is.

const SHOWN = 100;

function when(event) {
  return event.lastTimestamp || event.eventTime || event.firstTimestamp || event.metadata.creationTimestamp || '';
}

function ago(time) {
  const seconds = Math.max(0, Math.round((Date.now() - Date.parse(time)) / 1000));
  if (Number.isNaN(seconds)) return '';
  if (seconds < 90) return `${seconds}s`;
  if (seconds < 5400) return `${Math.round(seconds / 60)}m`;
  return `${Math.round(seconds / 3600)}h`;
}

const KINDS = { pod: 'Pod', service: 'Service', node: 'Node', slice: 'EndpointSlice' };

export function Events({ events, selected }) {
  const about = (e) =>
    !selected || (e.involvedObject?.kind === KINDS[selected.kind] && e.involvedObject?.name === selected.name && (e.involvedObject?.namespace ?? '') === (selected.namespace ?? ''));
  const shown = events.items
    .filter(about)
    .sort((a, b) => when(b).localeCompare(when(a)))
    .slice(0, SHOWN);
  return (
    <section class="events">
      <h2>Events{selected ? ` of ${selected.name}` : ''}</h2>
      {events.error && <p class="error">{events.error.message}</p>}
      <table>
        <thead>
          <tr>
            <th>Age</th>
            <th>Type</th>
            <th>Reason</th>
            <th>Object</th>
            <th>Message</th>
          </tr>
        </thead>
        <tbody>
          {shown.map((e) => (
            <tr key={`${e.metadata.namespace}/${e.metadata.name}`} class={e.type === 'Warning' ? 'warning' : ''}>
              <td>{ago(when(e))}</td>
              <td>{e.type}</td>
              <td>{e.reason}</td>
              <td>
                {e.involvedObject?.kind}/{e.involvedObject?.name}
              </td>
              <td>{e.message}</td>
            </tr>
          ))}
        </tbody>
      </table>
      {events.synced && shown.length === 0 && <p class="note">No events.</p>}
    </section>
  );
}
