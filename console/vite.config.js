// Builds the console into the API server's crate, where `include_bytes!`
// embeds it in the portal binary. File names carry no hash: the server
// serves each under a fixed path with its own ETag.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { defineConfig } from 'vite';

// The minifier drops the bundled packages' licence headers: their notices
// are served beside the page instead (/console/licenses.txt).
function licenses() {
  return {
    name: 'portal-console-licenses',
    generateBundle(_, bundle) {
      const packages = new Set();
      for (const chunk of Object.values(bundle)) {
        for (const id of Object.keys(chunk.modules ?? {})) {
          const match = /^(.*\/node_modules\/(?:@[^/]+\/)?[^/]+)\//.exec(id.replaceAll('\\', '/'));
          if (match) packages.add(match[1]);
        }
      }
      const notices = [...packages].sort().map((dir) => {
        const { name, version, license } = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8'));
        return `${name} ${version} (${license})\n\n${readFileSync(join(dir, 'LICENSE'), 'utf8').trim()}\n`;
      });
      this.emitFile({
        type: 'asset',
        fileName: 'licenses.txt',
        source: `Portal's web console includes these packages.\n\n${notices.join('\n----\n\n')}`,
      });
    },
  };
}

export default defineConfig({
  base: '/console/',
  oxc: { jsx: { runtime: 'automatic', importSource: 'preact' } },
  plugins: [licenses()],
  build: {
    outDir: '../crates/portal-apiserver/console',
    emptyOutDir: true,
    // The browsers kubectl users run: native modules, no polyfills.
    target: 'es2022',
    modulePreload: { polyfill: false },
    assetsInlineLimit: 0,
    reportCompressedSize: false,
    rolldownOptions: {
      output: {
        entryFileNames: 'console.js',
        chunkFileNames: 'console-[name].js',
        assetFileNames: 'console.[ext]',
      },
    },
  },
});
