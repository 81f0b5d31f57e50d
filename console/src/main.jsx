// The console's shell: sign-in, then the cluster view for the user the
// token belongs to.

import { render } from 'preact';
import { useEffect, useState } from 'preact/hooks';

import { session, setToken, token, whoami } from './api.js';
import { Cluster } from './cluster.jsx';
import './style.css';

function SignIn({ onSignedIn, problem }) {
  const [value, setValue] = useState('');
  const [error, setError] = useState(problem);
  const [busy, setBusy] = useState(false);
  const submit = async (event) => {
    event.preventDefault();
    setBusy(true);
    setToken(value.trim());
    try {
      onSignedIn(await whoami());
    } catch (failure) {
      setToken(null);
      setError(failure.code === 401 ? 'The server does not accept this token.' : failure.message);
    } finally {
      setBusy(false);
    }
  };
  return (
    <form class="sign-in" onSubmit={submit}>
      <h1>Portal console</h1>
      <p>
        Sign in with a bearer token. You see what the token's user may see: the same RBAC rules as <code>kubectl</code>.
      </p>
      <label for="token">Token</label>
      <textarea id="token" name="token" rows="4" spellcheck={false} autocomplete="off" value={value} onInput={(e) => setValue(e.currentTarget.value)} />
      <p class="hint">
        For example <code>kubectl create token NAME -n NAMESPACE</code> for a service account, or a line of <code>--token-auth-file</code>.
      </p>
      {error && <p class="error" role="alert">{error}</p>}
      <button type="submit" disabled={busy || !value.trim()}>Sign in</button>
      <p class="hint">
        <a href="licenses.txt">Third-party licences</a>
      </p>
    </form>
  );
}

function App() {
  // undefined: asking; null: signed out; else the server's UserInfo.
  const [user, setUser] = useState(undefined);
  const [problem, setProblem] = useState(null);
  useEffect(() => {
    session.ended = () => {
      setToken(null);
      setProblem('Your session has ended: sign in again.');
      setUser(null);
    };
    if (!token()) return setUser(null);
    whoami()
      .then(setUser)
      .catch((error) => {
        setToken(null);
        setProblem(error.code === 401 ? 'Your session has ended: sign in again.' : error.message);
        setUser(null);
      });
  }, []);
  if (user === undefined) return <p class="loading">Connecting…</p>;
  if (user === null) return <SignIn onSignedIn={setUser} problem={problem} />;
  const signOut = () => {
    setToken(null);
    setUser(null);
  };
  return <Cluster user={user} onSignOut={signOut} />;
}

render(<App />, document.getElementById('app'));
