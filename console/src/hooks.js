// Preact hooks over the live collections and the metrics readings.

import { useEffect, useState } from 'preact/hooks';

import { follow } from './live.js';

/** `{items, error, synced}` for the collection at `path` (null: none). */
export function useCollection(path) {
  const [state, setState] = useState({ items: [], error: null, synced: false });
  useEffect(() => {
    setState({ items: [], error: null, synced: false });
    if (!path) return undefined;
    return follow(path, {
      onChange: (items) => setState((s) => ({ ...s, items, synced: true })),
      onError: (error) => setState((s) => ({ ...s, error })),
    });
  }, [path]);
  return state;
}

/** Calls `tick` now and every `ms` while the page is visible. */
export function useInterval(tick, ms) {
  useEffect(() => {
    let stopped = false;
    let timer;
    const round = async () => {
      if (!document.hidden) await tick();
      if (!stopped) timer = setTimeout(round, ms);
    };
    round();
    return () => {
      stopped = true;
      clearTimeout(timer);
    };
  }, [ms]);
}
