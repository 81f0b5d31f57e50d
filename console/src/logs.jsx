// A pod's log, followed as `kubectl logs -f` does: the last lines, then
// each new one as the container writes it.

import { useEffect, useRef, useState } from 'preact/hooks';

import { lines, request } from './api.js';

const TAIL = 500;
const KEPT = 2000;

export function Logs({ pod }) {
  const containers = (pod.spec?.containers ?? []).map((c) => c.name);
  const [container, setContainer] = useState(containers[0]);
  const [text, setText] = useState([]);
  const [state, setState] = useState('connecting');
  const [round, setRound] = useState(0);
  const pane = useRef(null);
  const { namespace, name } = pod.metadata;
  // A log exists once the container ran: running now, or ended (this run or the last).
  const status = (pod.status?.containerStatuses ?? []).find((c) => c.name === container);
  const started = Boolean(status?.state?.running || status?.state?.terminated || status?.lastState?.terminated);

  useEffect(() => {
    if (!containers.includes(container)) setContainer(containers[0]);
  }, [pod.metadata.uid]);

  useEffect(() => {
    setText([]);
    if (!container || !started) {
      setState('waiting for the container to start');
      return undefined;
    }
    const controller = new AbortController();
    let timer = null;
    setState('following');
    (async () => {
      const path = `/api/v1/namespaces/${encodeURIComponent(namespace)}/pods/${encodeURIComponent(name)}/log?container=${encodeURIComponent(container)}&follow=true&tailLines=${TAIL}`;
      try {
        const response = await request(path, { signal: controller.signal, accept: 'text/plain' });
        let pending = [];
        for await (const line of lines(response)) {
          pending.push(line);
          // Appended in bursts: one render per burst, not per line.
          timer ??= setTimeout(() => {
            const batch = pending;
            pending = [];
            timer = null;
            if (!controller.signal.aborted) setText((t) => t.concat(batch).slice(-KEPT));
          }, 50);
        }
        setState('ended');
      } catch (error) {
        if (!controller.signal.aborted) setState(`failed: ${error.message}`);
      }
    })();
    return () => {
      controller.abort();
      clearTimeout(timer);
    };
  }, [namespace, name, container, started, round]);

  // Kept at the newest line while the reader is there; left alone once
  // they scroll up to read.
  const following = useRef(true);
  useEffect(() => {
    const element = pane.current;
    if (element && following.current) element.scrollTop = element.scrollHeight;
  }, [text]);
  const onScroll = (event) => {
    const element = event.currentTarget;
    following.current = element.scrollHeight - element.scrollTop - element.clientHeight < 24;
  };

  return (
    <section class="logs">
      <h3>
        Logs
        {containers.length > 1 && (
          <select aria-label="Container" value={container} onChange={(e) => setContainer(e.currentTarget.value)}>
            {containers.map((c) => (
              <option key={c}>{c}</option>
            ))}
          </select>
        )}
        <span class="log-state" data-state={state}>
          {state}
        </span>
        {state !== 'following' && started && <button onClick={() => setRound((r) => r + 1)}>Reconnect</button>}
      </h3>
      <pre class="log-lines" ref={pane} onScroll={onScroll}>
        {text.join('\n')}
      </pre>
    </section>
  );
}
