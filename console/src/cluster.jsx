// The signed-in page: namespaces on the left, the live graph in the
// middle, the selected object (and a pod's logs) on the right, events and
// the data path's charts below.

import { useMemo, useState } from 'preact/hooks';

import { collectionPath } from './api.js';
import { Charts } from './charts.jsx';
import { Details } from './details.jsx';
import { Events } from './events.jsx';
import { Graph } from './graph.jsx';
import { useCollection } from './hooks.js';
import { topology } from './topology.js';

const ALL = '';

function Namespaces({ namespaces, pods, services, current, onPick }) {
  const [typed, setTyped] = useState('');
  const count = (list, ns) => list.filter((o) => o.metadata.namespace === ns).length;
  const names = namespaces.items.map((n) => n.metadata.name).sort();
  return (
    <nav class="namespaces" aria-label="Namespaces">
      <h2>Namespaces</h2>
      <ul>
        <li>
          <button class={current === ALL ? 'current' : ''} onClick={() => onPick(ALL)}>
            All namespaces
          </button>
        </li>
        {names.map((name) => (
          <li key={name}>
            <button class={current === name ? 'current' : ''} data-namespace={name} onClick={() => onPick(name)}>
              {name}
              {current === ALL && (
                <span class="counts">
                  {count(services.items, name)} svc · {count(pods.items, name)} pods
                </span>
              )}
            </button>
          </li>
        ))}
      </ul>
      {namespaces.error && (
        <form
          onSubmit={(e) => {
            e.preventDefault();
            onPick(typed.trim());
          }}
        >
          <p class="note">You may not list namespaces: name one.</p>
          <input aria-label="Namespace name" value={typed} onInput={(e) => setTyped(e.currentTarget.value)} />
        </form>
      )}
    </nav>
  );
}

function Problems({ collections }) {
  const problems = collections.filter(([, c]) => c.error);
  if (problems.length === 0) return null;
  return (
    <ul class="problems" role="status">
      {problems.map(([what, c]) => (
        <li key={what}>
          {what}: {c.error.forbidden ? `not allowed (${c.error.message})` : c.error.message}
        </li>
      ))}
    </ul>
  );
}

export function Cluster({ user, onSignOut }) {
  const [namespace, setNamespace] = useState(ALL);
  const [selected, setSelected] = useState(null);
  const namespaces = useCollection('/api/v1/namespaces');
  const services = useCollection(collectionPath('/api/v1', 'services', namespace));
  const slices = useCollection(collectionPath('/apis/discovery.k8s.io/v1', 'endpointslices', namespace));
  const pods = useCollection(collectionPath('/api/v1', 'pods', namespace));
  const nodes = useCollection('/api/v1/nodes');
  const events = useCollection(collectionPath('/api/v1', 'events', namespace));

  const graph = useMemo(
    () => topology({ services: services.items, slices: slices.items, pods: pods.items, nodes: nodes.items }),
    [services.items, slices.items, pods.items, nodes.items],
  );
  const box = graph.boxes.find((b) => b.id === selected);
  const pick = (ns) => {
    setNamespace(ns);
    setSelected(null);
  };
  return (
    <div class="cluster">
      <header>
        <h1>Portal</h1>
        <span class="scope">{namespace === ALL ? 'all namespaces' : `namespace ${namespace}`}</span>
        <span class="user" title={(user.groups ?? []).join(', ')}>
          {user.username}
        </span>
        <button onClick={onSignOut}>Sign out</button>
      </header>
      <Namespaces namespaces={namespaces} pods={pods} services={services} current={namespace} onPick={pick} />
      <main>
        <Problems
          collections={[
            ['Services', services],
            ['EndpointSlices', slices],
            ['Pods', pods],
            ['Nodes', nodes],
          ]}
        />
        <Graph graph={graph} showNamespace={namespace === ALL} selected={selected} onSelect={setSelected} />
      </main>
      <aside class="details">{box ? <Details box={box} onClose={() => setSelected(null)} /> : <p class="note">Select a box to see it here; a pod shows its logs.</p>}</aside>
      <section class="below">
        <Events events={events} selected={box} />
        <Charts />
      </section>
    </div>
  );
}
