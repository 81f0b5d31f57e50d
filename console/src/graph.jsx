// The topology drawn as SVG: four columns, boxes coloured by state, edges
// as curves (dashed when the endpoint is not ready). Boxes glide to their
// new rows as the cluster changes.

import { COLUMNS } from './topology.js';

const BOX_WIDTH = 210;
const BOX_HEIGHT = 44;
const GAP = 56;
const ROW = 56;
const TOP = 34;
const TITLES = { service: 'Services', slice: 'EndpointSlices', pod: 'Pods', node: 'Nodes' };

const columnOf = (kind) => COLUMNS.indexOf(kind === 'address' ? 'pod' : kind);
const x = (kind) => columnOf(kind) * (BOX_WIDTH + GAP);
const y = (box) => TOP + box.y * ROW;

function clip(text, length) {
  return text.length > length ? `${text.slice(0, length - 1)}…` : text;
}

function Edge({ from, to, state }) {
  const x1 = x(from.kind) + BOX_WIDTH;
  const y1 = y(from) + BOX_HEIGHT / 2;
  const x2 = x(to.kind);
  const y2 = y(to) + BOX_HEIGHT / 2;
  const bend = GAP / 2;
  return <path class={`edge ${state}`} d={`M${x1},${y1} C${x1 + bend},${y1} ${x2 - bend},${y2} ${x2},${y2}`} />;
}

function Box({ box, showNamespace, selected, onSelect }) {
  const name = showNamespace && box.namespace ? `${box.namespace}/${box.name}` : box.name;
  const choose = () => onSelect(selected ? null : box.id);
  return (
    <g
      class={`box ${box.kind} ${box.state}${selected ? ' selected' : ''}`}
      data-id={box.id}
      data-state={box.state}
      style={{ transform: `translate(${x(box.kind)}px, ${y(box)}px)` }}
      role="button"
      tabIndex={0}
      aria-label={`${box.kind} ${name}: ${box.detail}`}
      onClick={choose}
      onKeyDown={(e) => (e.key === 'Enter' || e.key === ' ') && choose()}
    >
      <title>{`${name}\n${box.detail}`}</title>
      <rect width={BOX_WIDTH} height={BOX_HEIGHT} rx="6" />
      <text x="10" y="18" class="name">
        {clip(name, 27)}
      </text>
      <text x="10" y="35" class="detail">
        {clip(box.detail, 33)}
      </text>
    </g>
  );
}

export function Graph({ graph, showNamespace, selected, onSelect }) {
  const byId = new Map(graph.boxes.map((b) => [b.id, b]));
  const rows = graph.boxes.reduce((most, b) => Math.max(most, b.y + 1), 1);
  const width = COLUMNS.length * BOX_WIDTH + (COLUMNS.length - 1) * GAP;
  const height = TOP + rows * ROW;
  return (
    <div class="graph">
      {graph.hidden > 0 && <p class="note">{graph.hidden} more pods not drawn: pick a namespace.</p>}
      <svg viewBox={`0 0 ${width} ${height}`} style={{ maxWidth: `${width}px` }} role="img" aria-label="Services, EndpointSlices, pods and nodes">
        {COLUMNS.map((kind) => (
          <text key={kind} class="column-title" x={x(kind)} y="16">
            {TITLES[kind]} ({graph.boxes.filter((b) => columnOf(b.kind) === columnOf(kind)).length})
          </text>
        ))}
        {graph.edges.map((e) => (
          <Edge key={`${e.from}>${e.to}`} from={byId.get(e.from)} to={byId.get(e.to)} state={e.state} />
        ))}
        {graph.boxes.map((b) => (
          <Box key={b.id} box={b} showNamespace={showNamespace} selected={b.id === selected} onSelect={onSelect} />
        ))}
      </svg>
    </div>
  );
}
