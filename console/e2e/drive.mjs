// The browser half of tests/e2e/test_console.py: drives Debian's Chromium
// through the console as a user would, while making the changes it must
// show with real kubectl. Each step waits for what the page shows (no
// fixed sleeps); any failure exits non-zero with a screenshot beside the
// final one.
//
// Environment: CONSOLE_URL, TOKEN (a service account's), NAMESPACE,
// KUBECONFIG (the admin's, for kubectl), MANIFEST (a Deployment `web` and
// a Service `web`), SCREENSHOT (where the picture goes), DNS_SERVER (the
// cluster DNS's address, asked with dig), CHROMIUM.

import { execFileSync } from 'node:child_process';
import { chromium } from 'playwright-core';

const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
};
const [url, token, namespace, manifest, screenshot, dns] = ['CONSOLE_URL', 'TOKEN', 'NAMESPACE', 'MANIFEST', 'SCREENSHOT', 'DNS_SERVER'].map(env);
const WAIT = { timeout: 90_000 };

function kubectl(...args) {
  return execFileSync('kubectl', args, { encoding: 'utf8', timeout: 60_000 });
}

function step(text) {
  console.log(`console e2e: ${text}`);
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--disable-sync', '--no-first-run', '--disable-quic'],
});
// The API server's certificate is the cluster CA's, which this browser does not trust.
const context = await browser.newContext({ ignoreHTTPSErrors: true, viewport: { width: 1600, height: 1100 } });
const page = await context.newPage();
const errors = [];
page.on('pageerror', (error) => errors.push(String(error)));
// Refused requests (a wrong token, a forbidden list) are expected and
// logged by the browser itself; anything else the page logs as an error is not.
page.on('console', (m) => m.type() === 'error' && !m.text().startsWith('Failed to load resource') && errors.push(m.text()));
// The page's own files must all load.
page.on('response', (r) => new URL(r.url()).pathname.startsWith('/console/') && r.status() >= 400 && errors.push(`${r.status()} ${r.url()}`));

const box = (id) => page.locator(`g.box[data-id="${id}"]`);
const webPods = (state = '') => `g.box.pod${state ? `[data-state="${state}"]` : ''}[data-id^="pod/${namespace}/web-"]`;

async function expectCount(selector, count, what) {
  await page.waitForFunction(([s, n]) => document.querySelectorAll(s).length === n, [selector, count], WAIT).catch((error) => {
    throw new Error(`${what}: ${error.message}`);
  });
}

try {
  step('sign-in page');
  await page.goto(`${url}/console/`);
  await page.getByLabel('Token').waitFor(WAIT);

  step('a wrong token is refused');
  await page.getByLabel('Token').fill('not-a-token');
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByRole('alert').filter({ hasText: 'does not accept this token' }).waitFor(WAIT);

  step('the service account signs in');
  await page.getByLabel('Token').fill(token);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.locator('header .user').filter({ hasText: `system:serviceaccount:${namespace}:console-viewer` }).waitFor(WAIT);

  step('its rights are its own: no Services in all namespaces, no namespace list');
  await page.locator('.problems').filter({ hasText: 'Services: not allowed' }).waitFor(WAIT);
  await page.getByLabel('Namespace name').fill(namespace);
  await page.getByLabel('Namespace name').press('Enter');
  await page.locator('.scope').filter({ hasText: `namespace ${namespace}` }).waitFor(WAIT);
  await page.locator('.problems').waitFor({ state: 'detached', ...WAIT });

  step('kubectl creates a Deployment of two pods and its Service');
  kubectl('apply', '-n', namespace, '-f', manifest);
  await box(`service/${namespace}/web`).waitFor(WAIT);
  await expectCount(webPods('ready'), 2, 'two ready pods');
  // The Service's slice points at both pods, which run on the node.
  await page.waitForFunction(
    (ns) => [...document.querySelectorAll(`g.box.slice[data-id^="slice/${ns}/web-"]`)].some((g) => g.textContent.includes('2/2 ready')),
    namespace,
    WAIT,
  );
  await page.locator('g.box.node[data-state="ready"]').first().waitFor(WAIT);

  step('kubectl scales it to three: the graph follows the watch');
  kubectl('scale', '-n', namespace, 'deployment/web', '--replicas=3');
  await expectCount(webPods('ready'), 3, 'three ready pods');

  step("a pod's logs");
  await page.locator(webPods('ready')).first().click();
  await page.locator('.detail-panel .log-lines').filter({ hasText: 'serving web' }).waitFor(WAIT);

  step('events and the data-path charts');
  await page.locator('.events tbody tr').filter({ hasText: 'Scheduled' }).first().waitFor(WAIT);
  await page.locator('[data-metric="programming"]').filter({ hasText: 'ms over' }).waitFor(WAIT);
  // Ten queries to the cluster DNS (one a name that does not exist): the
  // chart's source counts them.
  for (let i = 0; i < 10; i += 1) {
    const name = i === 0 ? `nothing-here.${namespace}.svc.cluster.local` : `web.${namespace}.svc.cluster.local`;
    execFileSync('dig', ['+short', '+tries=1', '+time=5', `@${dns}`, name], { encoding: 'utf8', timeout: 30_000 });
  }
  await page.waitForFunction(() => Number(document.querySelector('[data-metric="queries"]')?.dataset.value) >= 10, null, WAIT);
  await page.waitForFunction(() => Number(document.querySelector('[data-metric="nxdomain"]')?.dataset.value) >= 1, null, WAIT);
  await page.waitForFunction(() => Number(document.querySelector('.charts')?.dataset.readings) >= 3, null, WAIT);
  await page.waitForFunction(() => [...document.querySelectorAll('.chart')].every((c) => Number(c.dataset.points) >= 2), null, WAIT);

  // Unselected, so the picture shows every event and the whole graph.
  await page.getByRole('button', { name: 'Close' }).click();
  await page.screenshot({ path: screenshot, fullPage: true });
  step(`screenshot: ${screenshot}`);

  step('kubectl deletes the Service: its box goes, and its slice with it');
  kubectl('delete', '-n', namespace, 'service/web');
  await box(`service/${namespace}/web`).waitFor({ state: 'detached', ...WAIT });
  await expectCount(`g.box.slice[data-id^="slice/${namespace}/web-"]`, 0, 'the slice gone');
  // The pods are the Deployment's: they stay, served by nothing.
  await expectCount(webPods('ready'), 3, 'the pods stay');

  if (errors.length) throw new Error(`the page reported errors: ${errors.join('; ')}`);
  step('passed');
} catch (error) {
  await page.screenshot({ path: screenshot.replace(/\.png$/, '-failed.png'), fullPage: true }).catch(() => {});
  console.error(`console e2e failed: ${error.stack || error}`);
  if (errors.length) console.error(`page errors: ${errors.join('; ')}`);
  process.exitCode = 1;
} finally {
  await browser.close();
}
