// The data path at a glance, from the server's own /metrics read every two
// seconds: how long a change takes to reach the proxy's rules (kube-proxy's
// network programming latency) and how many DNS queries the cluster DNS
// answers. Each point is what happened since the reading before.

import { useEffect, useRef, useState } from 'preact/hooks';
import uPlot from 'uplot';
import 'uplot/dist/uPlot.min.css';

import { request } from './api.js';
import { useInterval } from './hooks.js';
import { difference, histogram, parse, quantile, total } from './prometheus.js';

const PERIOD_MS = 2000;
const KEPT = 150; // five minutes of readings
const PROGRAMMING = 'kubeproxy_network_programming_duration_seconds';
const QUERIES = 'portal_dns_queries_total';

const ms = (seconds) => (seconds === null ? null : Math.round(seconds * 1e5) / 100);

/** Readings of /metrics turned into series: `{times, p50, p99, queries, nxdomain, latest}`. */
function useDataPath() {
  const [series, setSeries] = useState({ times: [], p50: [], p99: [], queries: [], nxdomain: [], readings: 0, latest: null, error: null });
  const last = useRef(null);
  useInterval(async () => {
    let samples;
    try {
      samples = parse(await (await request('/metrics', { accept: 'text/plain' })).text());
    } catch (error) {
      setSeries((s) => ({ ...s, error }));
      return;
    }
    const now = Date.now() / 1000;
    const reading = {
      time: now,
      programming: histogram(samples, PROGRAMMING),
      queries: total(samples, QUERIES),
      nxdomain: total(samples, QUERIES, (l) => l.rcode === 'NXDOMAIN'),
      served: samples.has(`${PROGRAMMING}_count`) || samples.has(QUERIES),
    };
    const before = last.current;
    last.current = reading;
    setSeries((s) => {
      const latest = { programming: reading.programming, queries: reading.queries, nxdomain: reading.nxdomain, served: reading.served };
      if (!before) return { ...s, latest, readings: s.readings + 1, error: null };
      const seconds = reading.time - before.time;
      const changes = difference(before.programming, reading.programming);
      // A counter that went down was reset (a restart): all of it is new.
      const rate = (now, then) => (now >= then ? now - then : now) / seconds;
      const keep = (list, value) => list.concat([value]).slice(-KEPT);
      return {
        times: keep(s.times, reading.time),
        p50: keep(s.p50, ms(quantile(0.5, changes))),
        p99: keep(s.p99, ms(quantile(0.99, changes))),
        queries: keep(s.queries, rate(reading.queries, before.queries)),
        nxdomain: keep(s.nxdomain, rate(reading.nxdomain, before.nxdomain)),
        readings: s.readings + 1,
        latest,
        error: null,
      };
    });
  }, PERIOD_MS);
  return series;
}

function Chart({ title, unit, labels, data, colors }) {
  const box = useRef(null);
  const plot = useRef(null);
  useEffect(() => {
    const options = {
      width: box.current.clientWidth || 400,
      height: 160,
      legend: { show: true },
      scales: { x: { time: true } },
      axes: [{}, { label: unit, size: 60 }],
      series: [{}, ...labels.map((label, i) => ({ label, stroke: colors[i], width: 2, spanGaps: false, points: { show: true, size: 4 } }))],
    };
    plot.current = new uPlot(options, data, box.current);
    const resize = new ResizeObserver(() => plot.current.setSize({ width: box.current.clientWidth, height: 160 }));
    resize.observe(box.current);
    return () => {
      resize.disconnect();
      plot.current.destroy();
    };
  }, []);
  useEffect(() => plot.current?.setData(data), [data]);
  return (
    <figure class="chart" data-points={data[0].length}>
      <figcaption>{title}</figcaption>
      <div ref={box} />
    </figure>
  );
}

export function Charts() {
  const s = useDataPath();
  if (s.error) {
    return (
      <section class="charts">
        <h2>Data path</h2>
        <p class="note">{s.error.forbidden ? 'Your user may not read /metrics (the system:monitoring role grants it).' : s.error.message}</p>
      </section>
    );
  }
  const programming = s.latest?.programming;
  const p99 = programming ? ms(quantile(0.99, programming)) : null;
  return (
    <section class="charts" data-readings={s.readings}>
      <h2>Data path</h2>
      <p class="totals">
        <span data-metric="programming">
          Proxy programming p99 since start: {p99 === null ? 'no changes yet' : `${p99} ms over ${programming.count} changes`}
        </span>
        <span data-metric="queries" data-value={s.latest?.queries}>
          DNS queries answered: {s.latest ? s.latest.queries : '…'}
        </span>
        <span data-metric="nxdomain" data-value={s.latest?.nxdomain}>
          of which NXDOMAIN: {s.latest ? s.latest.nxdomain : '…'}
        </span>
      </p>
      <Chart title="Network programming latency (EndpointSlice change → proxy rules)" unit="ms" labels={['p50', 'p99']} colors={['#2b8a3e', '#e67700']} data={[s.times, s.p50, s.p99]} />
      <Chart title="Cluster DNS queries" unit="per second" labels={['answered', 'NXDOMAIN']} colors={['#1971c2', '#c92a2a']} data={[s.times, s.queries, s.nxdomain]} />
    </section>
  );
}
